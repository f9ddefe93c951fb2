"""Which run's personal fields the JSON being written now belongs to.

Values are sealed where the store turns them into column values (`seal_stored`), so no step,
event or wait needs to know about it; the scope says whose key and which fields. A worker
opens one per step message (`run_scope`) and names its run once it knows the workflow
(`enter_run`); a workflow declaring nothing personal costs one context variable read per value.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from agentflow._privacy import envelope, keystore
from agentflow._privacy.personal import Personal, seal_paths


@dataclass
class _Scope:
    run_id: str | None = None
    #: Whether the run may hold personal fields (its workflow declares them): only then is
    #: its binding looked up.
    personal: bool = False
    #: Known before the run exists (its start): the key id and paths.
    known: tuple[str, tuple[tuple[str, ...], ...]] | None = None


_current: ContextVar[_Scope | None] = ContextVar("agentflow_privacy_scope", default=None)


@contextmanager
def run_scope(run_id: str | None = None, *, personal: bool = False) -> Iterator[None]:
    """JSON written inside is sealed as run `run_id`'s (once `enter_run` says it may be)."""
    token = _current.set(_Scope(run_id=run_id, personal=personal))
    try:
        yield
    finally:
        _current.reset(token)


def run_scope_for(run_id: Any) -> AbstractContextManager[None]:
    """`run_scope(run_id)` unless a scope is open already (a worker's, a start's): for a row
    of one run written outside them."""
    if run_id is None or _current.get() is not None:
        return nullcontext()
    return run_scope(str(run_id), personal=True)


def enter_run(run_id: str, personal: Personal | None) -> None:
    """The scope's run is `run_id`, of a workflow declaring `personal` (None: nothing)."""
    scope = _current.get()
    if scope is not None:
        scope.run_id, scope.personal = run_id, personal is not None


@contextmanager
def sealing(key_id: str, paths: tuple[tuple[str, ...], ...]) -> Iterator[None]:
    """Inside, every JSON value written has `paths` sealed under `key_id`: a run's first rows,
    written before the run exists to be looked up (`durable.start`)."""
    token = _current.set(_Scope(personal=True, known=(key_id, paths)))
    try:
        yield
    finally:
        _current.reset(token)


def seal_stored(value: Any) -> Any:
    """`value` as the store writes it: the current run's personal fields sealed."""
    scope = _current.get()
    if scope is None or not scope.personal or value is None:
        return value
    found = scope.known
    if found is None:
        if scope.run_id is None:
            return value
        found = keystore.binding(scope.run_id)
        if found is None:
            return value
    key_id, paths = found
    return seal_paths(value, paths, lambda v: envelope.seal_value(key_id, v))
