"""Which build this process runs (docs/deploys.md, "Builds"), and the Celery queue that is that
build's own.

A build is the code a process runs: `AGENTFLOW_BUILD_ID` when set (a release's git sha, an
image tag: what production should set, the same in web, worker and beat of a release), else a
digest of the registered workflow definitions, computed the same way in every process: names,
versions, versioning, steps in order with their kinds, compensations and waits, and the source
of each step, reconcile, tool, compensation and agent function, with the source file each is
defined in (so a prompt kept beside the function counts too); not a `@task`'s, which only the
processes that imported its module know. Code a digest cannot see (a
helper module, a library's upgrade) changes behaviour without changing the digest: that is why
a release names its build.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import tokenize
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from agentflow._base import identifiers
from agentflow._conf import settings
from agentflow._core.registry import StepDef, Workflow, definitions, generation, on_demand

#: Every worker consumes the shared step queue and this one, of its own build.
QUEUE_PREFIX = "agentflow.build."
#: The runs' and steps' build columns hold this many characters.
BUILD_ID_MAX_CHARS = 100

_digests: dict[int, str] = {}


def current() -> str:
    """This process's build: a dict lookup once computed (every step message asks).
    ImproperlyConfigured: AGENTFLOW_BUILD_ID is no name a build column can hold (the system
    check says so at deploy time; a worker refuses to start on it)."""
    named = settings.AGENTFLOW_BUILD_ID
    if named:
        return _named(str(named))
    key = generation()
    found = _digests.get(key)
    if found is None:
        found = _digests[key] = digest()
    return found


def named_problem(value: Any) -> str:
    """Why AGENTFLOW_BUILD_ID's `value` cannot name a build (empty: it can)."""
    return identifiers.problem("build id", str(value), max_chars=BUILD_ID_MAX_CHARS)


@cache
def _named(build: str) -> str:
    refused = named_problem(build)
    if refused:
        raise ImproperlyConfigured(f"AGENTFLOW_BUILD_ID: {refused}")
    return build


def queue(build: str) -> str:
    """The Celery queue only workers of `build` consume (any broker takes the name). Two ids
    that differ only in other characters (`release/1`, `release:1`) share one: a pinned run's
    step taken by the other build's worker is forwarded again (`routing.admit`), never run
    there."""
    return QUEUE_PREFIX + re.sub(r"[^A-Za-z0-9._-]", "_", build)


def route(build: str, pinned: bool) -> str | None:
    """Where a publisher that knows the run sends its step: a run pinned to its build, to that
    build's queue; any other to the shared queue (None), where whichever worker takes it
    decides (`agentflow._builds.routing.admit`)."""
    return queue(build) if pinned and build else None


def digest() -> str:
    """The digest of the registered definitions (see the module)."""
    hashed = hashlib.sha256()
    files: set[str] = set()
    for workflow in definitions():
        if on_demand(workflow.name):
            # A `@task`'s workflow is defined when its module is imported, which a worker
            # (Celery imports every app's `tasks`) does and a web process may not.
            continue
        hashed.update(json.dumps(summary(workflow), sort_keys=True).encode())
        for fn in _functions(workflow):
            hashed.update(_source(fn).encode())
            path = inspect.getsourcefile(fn) if _has_source(fn) else None
            if path:
                files.add(path)
    for path in sorted(files):
        try:
            with open(path, "rb") as source:
                hashed.update(source.read())
        except OSError:
            hashed.update(path.encode())
    return f"defs-{hashed.hexdigest()[:16]}"


def summary(workflow: Workflow) -> dict[str, Any]:
    """What a newer build compares a run against (kept in the builds table): the workflow's
    shape, without its code."""
    toolbox = getattr(workflow, "toolbox", None)
    shape: dict[str, Any] = {
        "name": workflow.name,
        "version": workflow.version,
        "versioning": workflow.versioning,
        "on_failure": workflow.on_failure,
        "agent": getattr(workflow, "fn", None) is not None,
        "steps": [_step_summary(step) for step in workflow.steps.values()],
    }
    if toolbox is not None:
        shape["tools"] = [
            {
                "name": name,
                "kind": str(toolbox[name].step_kind),
                "compensate": toolbox[name].compensate,
            }
            for name in toolbox.names
        ]
    return shape


def definitions_summary() -> dict[str, Any]:
    """Every registered workflow's latest shape, by name."""
    latest: dict[str, Workflow] = {}
    for workflow in definitions():
        if workflow.name not in latest or latest[workflow.name].version < workflow.version:
            latest[workflow.name] = workflow
    return {name: summary(workflow) for name, workflow in sorted(latest.items())}


def _step_summary(step: StepDef) -> dict[str, Any]:
    return {
        "name": step.name,
        "kind": str(step.kind),
        "compensate": step.compensate,
        "compensation_only": step.compensation_only,
        "waits": step.waits_for is not None,
    }


def _functions(workflow: Workflow) -> Iterator[Callable[..., Any]]:
    for step in workflow.steps.values():
        yield step.fn
        if step.reconcile is not None:
            yield step.reconcile
    fn = getattr(workflow, "fn", None)
    if fn is not None:
        yield fn
    toolbox = getattr(workflow, "toolbox", None)
    if toolbox is not None:
        tools = [toolbox[name] for name in toolbox.names]
        tools += list(getattr(toolbox, "_compensations", {}).values())
        for tool in tools:
            yield tool.fn
            if tool.reconcile is not None:
                yield tool.reconcile


def _has_source(fn: Callable[..., Any]) -> bool:
    return inspect.isfunction(fn) or inspect.ismethod(fn)


def _source(fn: Callable[..., Any]) -> str:
    """The function's source, or its qualified name where there is none (a builtin) or it
    cannot be cut out (Python 3.13's tokenizer refuses some lambdas' lines: TokenError)."""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError, SyntaxError, tokenize.TokenError):
        return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}"
