"""Who may read a run's sensitive arguments in the admin, and the run's rows as everyone else
sees them: every sensitive value shown as "redacted (N characters)" (agentflow._core.sensitive).

A call's sensitive arguments (a graph step's approval arguments, a tool's parameters, declared
with `Sensitive`) are read by those who must decide the call — holders of
`agentflow.approve_workflowrun` — and by holders of the permissions the declaration names (the
domain's own view permission), provided they may see runs at all; the approve page applies the
same rule, so an approver who may not view runs reads them redacted there too. Everyone else
gets every page of the run with each value masked wherever it appears: the waiting call, the
waits and decisions, the events, the steps, the conversation and the timeline's hovers, which are
all drawn from the rows this module hands out.

The masking is by value: the values are read from where the engine records a call's arguments
(`store.sensitive_values`), and every text shown is searched for them. A definition this
code does not have cannot say what is sensitive: then every approval and tool argument is.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar
from urllib.parse import unquote, unquote_plus

from django.http import HttpRequest

from agentflow import _store as store
from agentflow._core import links, registry
from agentflow._core.sensitive import Redactor, Sensitive
from agentflow.models import RunEvent, RunWait, StepCheckpoint, SupersededStep, WorkflowRun

#: Deciding calls that wait for approval (the admin's Approve and Reject).
APPROVE = "agentflow.approve_workflowrun"
#: Seeing runs at all: the admin's view permission (its change permission implies it).
RUN_VIEW = ("agentflow.view_workflowrun", "agentflow.change_workflowrun")
_ATTACHED = "_agentflow_privacy"

Row = TypeVar("Row", StepCheckpoint, SupersededStep, RunEvent, RunWait)


@dataclass(frozen=True)
class Privacy:
    """One viewer's view of one run's rows: unchanged for a reader, masked for anyone else."""

    redactor: Redactor

    @property
    def redacts(self) -> bool:
        return bool(self.redactor)

    def value(self, value: Any) -> Any:
        return self.redactor.value(value)

    def text(self, value: str) -> str:
        return self.redactor.text(value)

    def row(self, row: Row) -> Row:
        """A copy of a checkpoint, superseded step, event or wait with its shown fields masked
        (never saved: the engine's rows are the store's to write)."""
        if not self.redactor:
            return row
        shown = copy.copy(row)
        for name in ("arguments", "output", "outcome", "data"):
            if hasattr(shown, name):
                setattr(shown, name, self.value(getattr(shown, name)))
        for name in ("error", "detail", "reason"):
            if hasattr(shown, name):
                setattr(shown, name, self.text(getattr(shown, name)))
        return shown

    def rows(self, rows: Iterable[Row]) -> list[Row]:
        return [self.row(row) for row in rows]

    def links(self, found: Iterable[links.Link]) -> list[links.Link]:
        """The domain's links as this viewer may follow them: a link whose address carries a
        value they may not read is a key to what it opens (a customer's page, found by its
        id) and is left out; the others keep their address, their words masked."""
        if not self.redactor:
            return list(found)
        shown = []
        for link in found:
            if any(
                self.text(a) != a for a in (link.url, unquote(link.url), unquote_plus(link.url))
            ):
                continue
            shown.append(replace(link, label=self.text(link.label), title=self.text(link.title)))
        return shown


OPEN = Privacy(Redactor())


def may_read(user: Any, sensitive: Sensitive | None) -> bool:
    """May `user` read a call's sensitive arguments (`sensitive` None: the definition is not in
    this code, so only its deciders may)?"""
    if not any(user.has_perm(p) for p in RUN_VIEW):
        return False
    if user.has_perm(APPROVE):
        return True
    return sensitive is not None and any(user.has_perm(p) for p in sensitive.readers)


def for_run(request: HttpRequest, run: WorkflowRun) -> Privacy:
    """What `request`'s user may read of `run` (worked out once per request and run)."""
    return _memo(request, run.pk, run.workflow, run.version)


def said(request: HttpRequest, run: Mapping[str, Any], text: str) -> str:
    """`text` about `run` (a summary with its pk, workflow and version) as `request`'s user may
    read it: what an operator action answered may quote a call (a refusal's difference)."""
    return _memo(request, run["pk"], run["workflow"], run["version"]).text(text)


def _memo(request: HttpRequest, run_id: str, workflow: str, version: int) -> Privacy:
    memo: dict[str, Privacy] = request.__dict__.setdefault(_ATTACHED, {})
    found = memo.get(run_id)
    if found is None:
        found = memo[run_id] = _privacy(request.user, run_id, workflow, version)
    return found


def attach(run: WorkflowRun, privacy: Privacy) -> WorkflowRun:
    """Keep the viewer's privacy on the run object the page renders (the admin's field
    methods are handed the object alone)."""
    setattr(run, _ATTACHED, privacy)
    return run


def attached(run: WorkflowRun) -> Privacy:
    """The privacy `attach` kept on this run object; without one, what a viewer with no
    permission may read (nothing sensitive)."""
    found = getattr(run, _ATTACHED, None)
    if isinstance(found, Privacy):
        return found
    return _privacy(None, run.pk, run.workflow, run.version)


def _privacy(user: Any, run_id: str, workflow: str, version: int) -> Privacy:
    definition = registry.lookup(workflow, version)
    if definition is not None and not definition.declares_sensitive():
        return OPEN  # nothing in this workflow is sensitive: no query
    hidden: Mapping[str, Sensitive] | None = None
    hidden_input: Sensitive | None = None
    if definition is not None:
        declared = definition.sensitive_calls()
        hidden = {n: s for n, s in declared.items() if user is None or not may_read(user, s)}
        found = definition.sensitive_input
        if found is not None and (user is None or not may_read(user, found)):
            hidden_input = found
        if not hidden and hidden_input is None:
            return OPEN
    elif user is not None and may_read(user, None):
        return OPEN
    return Privacy(Redactor(store.sensitive_values(run_id, hidden, input_declared=hidden_input)))
