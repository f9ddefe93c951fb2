"""Who may read a run's sensitive arguments in the admin, and the run's rows as everyone else
sees them: every sensitive value shown as "redacted (N characters)" (agentflow.sensitive).

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
from dataclasses import dataclass
from typing import Any, TypeVar

from django.http import HttpRequest

from agentflow import registry, store
from agentflow.models import RunEvent, RunWait, StepCheckpoint, SupersededStep, WorkflowRun
from agentflow.sensitive import Redactor, Sensitive

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
    memo: dict[str, Privacy] = request.__dict__.setdefault(_ATTACHED, {})
    found = memo.get(run.pk)
    if found is None:
        found = memo[run.pk] = _privacy(request.user, run)
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
    return found if isinstance(found, Privacy) else _privacy(None, run)


def _privacy(user: Any, run: WorkflowRun) -> Privacy:
    definition = registry.lookup(run.workflow, run.version)
    declared = definition.sensitive_calls() if definition is not None else None
    if declared is not None and not declared:
        return OPEN  # nothing in this workflow is sensitive: no query
    if declared is None:
        hidden: Mapping[str, Sensitive] | None = None
    else:
        hidden = {n: s for n, s in declared.items() if user is None or not may_read(user, s)}
        if not hidden:
            return OPEN
    if hidden is None and user is not None and may_read(user, None):
        return OPEN
    return Privacy(Redactor(store.sensitive_values(run.pk, hidden)))
