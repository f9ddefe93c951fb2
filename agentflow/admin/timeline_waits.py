"""A run's waits (timer, signal, approval) as spans on its timeline: from when the run reached
the wait to when it ended, with what it waited for and how it ended, in words.

Read from the wait rows (`RunWait`), which keep both ends and the outcome; a wait still open
runs to "now" while the run is active, or to the run's last change once it stopped.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from agentflow._base.states import ACTIVE_RUN_STATUSES, WaitKind
from agentflow._core.registry import NEXT_CALL
from agentflow.models import RunWait, WorkflowRun


class WaitEnd(StrEnum):
    """How a wait ended; a word each in the picture."""

    #: Still waiting.
    OPEN = "open"
    #: Its run stopped (cancelled, parked, failed) with nothing answering it.
    UNANSWERED = "unanswered"
    WOKE = "woke"
    RECEIVED = "received"
    #: A signal sent before the run got there, kept, and taken the moment it arrived.
    TAKEN = "taken"
    TIMED_OUT = "timed_out"
    APPROVED = "approved"
    REJECTED = "rejected"


@dataclass(frozen=True, kw_only=True)
class WaitSpan:
    seq: int
    kind: str
    name: str
    start: datetime
    end: datetime
    ended: WaitEnd
    #: What it waited for: "a timer", "signal 'reply'", "approval of charge".
    what: str
    #: How it ended, in words: "approved by alice", "timed out", "waiting".
    how: str
    deadline: datetime | None = None
    #: Another branch's wait (a fork set it aside), or None for the run's own.
    branch: int | None = None

    @property
    def label(self) -> str:
        return f"{self.what}: {self.how}"


def wait_spans(run: WorkflowRun, waits: Iterable[RunWait], *, now: datetime) -> list[WaitSpan]:
    """Each wait of the run as a span, in the order the run reached them."""
    active = run.status in ACTIVE_RUN_STATUSES
    spans = [_span(run, wait, now=now, active=active) for wait in waits]
    return sorted(spans, key=lambda span: (span.start, span.seq))


def lane_name(run: WorkflowRun, span: WaitSpan) -> str:
    """The name of a position that has no checkpoint yet (the run waits there): its step's
    (a graph run's current step), else the call it waits at, as it will be recorded."""
    if span.seq == run.current_seq and run.current_step and run.current_step != NEXT_CALL:
        return run.current_step
    if span.kind == WaitKind.SIGNAL:
        return f"wait_for:{span.name}"
    if span.kind == WaitKind.TIMER:
        return "sleep"
    return span.name


def _span(run: WorkflowRun, wait: RunWait, *, now: datetime, active: bool) -> WaitSpan:
    what = {
        str(WaitKind.TIMER): "a timer",
        str(WaitKind.SIGNAL): f"signal {wait.name!r}",
        str(WaitKind.APPROVAL): f"approval of {wait.name}",
    }.get(wait.kind, wait.kind)
    ended, how = _ending(run, wait, active=active)
    end = wait.resolved_at or (now if active else run.updated_at)
    return WaitSpan(
        seq=wait.seq,
        kind=wait.kind,
        name=wait.name,
        start=wait.requested_at,
        end=max(end, wait.requested_at),
        ended=ended,
        what=what,
        how=how,
        deadline=wait.deadline,
        branch=wait.branch if wait.branch != run.branch else None,
    )


def _ending(run: WorkflowRun, wait: RunWait, *, active: bool) -> tuple[WaitEnd, str]:
    outcome = wait.outcome if isinstance(wait.outcome, dict) else None
    if wait.resolved_at is None or outcome is None:
        if active:
            return WaitEnd.OPEN, "waiting"
        return WaitEnd.UNANSWERED, f"unanswered (the run is {run.get_status_display().lower()})"
    if wait.kind == WaitKind.TIMER:
        return WaitEnd.WOKE, "its time came"
    if outcome.get("timed_out"):
        if wait.kind == WaitKind.APPROVAL:
            return WaitEnd.TIMED_OUT, "rejected: no decision in time"
        return WaitEnd.TIMED_OUT, "timed out"
    if wait.kind == WaitKind.SIGNAL:
        if wait.resolved_at <= wait.requested_at:
            return WaitEnd.TAKEN, f"taken at once, sent earlier ({wait.reason})"
        return WaitEnd.RECEIVED, f"received ({wait.reason})"
    actor = wait.actor or "an operator"
    if outcome.get("approved"):
        return WaitEnd.APPROVED, f"approved by {actor}"
    return WaitEnd.REJECTED, f"rejected by {actor}"
