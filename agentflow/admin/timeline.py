"""What happened when in one run, as spans and marks on one time axis (drawn by `timeline_svg`).

A pure function of rows: the run, its checkpoints and its events. A checkpoint holds only a
step's LAST attempt; the earlier ones are told by the events the engine writes about them
(`attempt_failed` with its times and retry time, `takeover` with the lost attempt it replaced),
so each step's attempts are those events plus the checkpoint. Event data is read defensively:
a missing or malformed field drops that detail, never the page.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from agentflow._base.states import ACTIVE_RUN_STATUSES, StepStatus
from agentflow.admin.timeline_waits import WaitSpan, lane_name, wait_spans
from agentflow.models import RunEvent, RunWait, StepCheckpoint, SupersededStep, WorkflowRun

#: Two attempt records closer than this are the same attempt told twice (event and checkpoint).
SAME_INSTANT = timedelta(milliseconds=1)
#: Texts in hover titles are cut here: an error can be a whole HTML page from a partner.
MAX_TEXT_CHARS = 300


class Outcome(StrEnum):
    """How an attempt ended; each has a colour, a glyph and a word in the picture."""

    COMPLETED = "completed"
    #: Failed and another attempt followed (or is scheduled).
    RETRIED = "retried"
    #: Failed for good.
    FAILED = "failed"
    #: Its worker vanished (killed, paused past its lease); another worker took the step over.
    LOST = "lost"
    #: Still running now.
    RUNNING = "running"
    #: Interrupted with no recorded end: the run was parked or cancelled while it ran.
    INTERRUPTED = "interrupted"
    #: An operator's fork set its call aside (agent runs): history, never replayed.
    SUPERSEDED = "superseded"


class MarkKind(StrEnum):
    SWEEP = "sweep"
    OPERATOR = "operator"
    PARKED = "parked"
    RECONCILED = "reconciled"
    LATE = "late"
    COMPENSATION = "compensation"
    DIVERGED = "diverged"
    FORK = "fork"


MARK_KINDS: Mapping[str, MarkKind] = {
    RunEvent.Kind.SWEEP_REQUEUE: MarkKind.SWEEP,
    RunEvent.Kind.OPERATOR_RETRY: MarkKind.OPERATOR,
    RunEvent.Kind.OPERATOR_CANCEL: MarkKind.OPERATOR,
    RunEvent.Kind.OPERATOR_RESUME: MarkKind.OPERATOR,
    RunEvent.Kind.OPERATOR_APPROVE: MarkKind.OPERATOR,
    RunEvent.Kind.OPERATOR_REJECT: MarkKind.OPERATOR,
    RunEvent.Kind.NEEDS_ATTENTION: MarkKind.PARKED,
    RunEvent.Kind.VERSION_MISMATCH: MarkKind.PARKED,
    RunEvent.Kind.OUTCOME_UNKNOWN: MarkKind.PARKED,
    RunEvent.Kind.RECONCILED: MarkKind.RECONCILED,
    RunEvent.Kind.LATE_COMPLETION: MarkKind.LATE,
    RunEvent.Kind.COMPENSATION: MarkKind.COMPENSATION,
    RunEvent.Kind.DIVERGENCE: MarkKind.DIVERGED,
    RunEvent.Kind.FORK: MarkKind.FORK,
}


@dataclass(frozen=True, kw_only=True)
class Attempt:
    number: int | None
    start: datetime
    end: datetime
    outcome: Outcome
    owner: str = ""
    error: str = ""
    fence: int | None = None


@dataclass(frozen=True, kw_only=True)
class Interval:
    """A stretch with nothing running: a back-off wait, or a crash gap (claim to takeover)."""

    start: datetime
    end: datetime
    note: str


@dataclass(frozen=True, kw_only=True)
class Mark:
    at: datetime
    kind: MarkKind
    label: str


@dataclass(kw_only=True)
class Lane:
    seq: int
    name: str
    kind: str
    status: str
    #: When the step's first attempt began (the checkpoint keeps it across attempts).
    first_started_at: datetime | None = None
    attempts: list[Attempt] = field(default_factory=list)
    waits: list[Interval] = field(default_factory=list)
    gaps: list[Interval] = field(default_factory=list)
    #: Earlier attempts the checkpoint counts but no event describes (rows older than the events).
    unrecorded: Interval | None = None
    marks: list[Mark] = field(default_factory=list)
    #: The timer, signal or approval the step waited for before it ran (or waits for now).
    wait_spans: list[WaitSpan] = field(default_factory=list)

    @property
    def attempt_count(self) -> int:
        """Attempts drawn, or more if the checkpoint counts some its events do not describe
        (a superseded call's attempts are another call's)."""
        own = [a for a in self.attempts if a.outcome != Outcome.SUPERSEDED]
        return max(len(own), (own[-1].number or 0) if own else 0)

    @property
    def summary(self) -> str:
        """The lane's outcome in words, so the picture never relies on colour alone."""
        last = self.attempts[-1] if self.attempts else None
        if last is None and self.wait_spans:
            return f"⏸ {self.wait_spans[-1].how}"
        if last is None:
            return "no attempt recorded"
        tries = self.attempt_count
        count = f"{tries} attempts · " if tries > 1 else ""
        if last.outcome == Outcome.COMPLETED:
            # A step without a claim records only its end: its duration is unknown.
            took = last.end - last.start
            shown = f" · {seconds_text(took)}" if took and not count else ""
            return f"✓ {count}completed{shown}"
        if last.outcome == Outcome.RUNNING:
            return f"▶ {count}running"
        if last.outcome == Outcome.RETRIED:
            return f"↻ {count}retry due" if self.waits else f"↻ {count}retryable"
        if last.outcome == Outcome.INTERRUPTED:
            return f"■ {count}interrupted"
        if last.outcome == Outcome.SUPERSEDED:
            return f"↶ {count}superseded by a fork"
        return f"✕ {count}failed"


@dataclass(frozen=True, kw_only=True)
class Timeline:
    run_id: str
    start: datetime
    end: datetime
    #: The run is still active: the right edge is "now", not an end.
    open_ended: bool
    lanes: list[Lane]
    #: Run-level events (operator actions, parking, compensation) with no step of their own.
    run_marks: list[Mark]
    #: Only the latest events were read (a run swept for days has thousands).
    events_cut: bool = False

    @property
    def outcomes(self) -> set[Outcome]:
        return {a.outcome for lane in self.lanes for a in lane.attempts}

    @property
    def wait_kinds(self) -> set[str]:
        return {span.kind for lane in self.lanes for span in lane.wait_spans}

    @property
    def mark_kinds(self) -> set[MarkKind]:
        marks = [*self.run_marks, *(m for lane in self.lanes for m in lane.marks)]
        return {m.kind for m in marks}


def seconds_text(delta: timedelta) -> str:
    seconds = max(delta.total_seconds(), 0.0)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def build(
    run: WorkflowRun,
    steps: Iterable[StepCheckpoint],
    events: Iterable[RunEvent],
    *,
    now: datetime,
    events_cut: bool = False,
    superseded: Iterable[SupersededStep] = (),
    waits: Iterable[RunWait] = (),
) -> Timeline:
    """The run's timeline as of `now`; steps a fork set aside are drawn before the calls that
    replaced them at the same positions, and each wait on its step's lane (a lane of its own
    while the run waits there, before the step has a checkpoint)."""
    active = run.status in ACTIVE_RUN_STATUSES
    by_seq: dict[int, list[RunEvent]] = {}
    run_marks: list[Mark] = []
    lanes = {cp.seq: _lane_from_checkpoint(cp, run, now, active) for cp in steps}
    for event in events:
        seq = _lane_of(event)
        if seq is not None and seq in lanes:
            by_seq.setdefault(seq, []).append(event)
        elif event.kind in MARK_KINDS:
            run_marks.append(_mark(event))
    for seq, lane in lanes.items():
        _add_events(lane, by_seq.get(seq, []))
    for row in superseded:
        lane = lanes.setdefault(
            row.seq, Lane(seq=row.seq, name=row.name, kind=row.kind, status="superseded")
        )
        lane.attempts = sorted([*lane.attempts, _set_aside(row)], key=lambda a: a.start)
    for span in wait_spans(run, waits, now=now):
        lane = lanes.setdefault(
            span.seq,
            Lane(seq=span.seq, name=lane_name(run, span), kind="wait", status="waiting"),
        )
        lane.wait_spans.append(span)
    ordered = [lanes[seq] for seq in sorted(lanes)]
    instants = [run.created_at, now if active else run.updated_at]
    for lane in ordered:
        instants += [t for a in lane.attempts for t in (a.start, a.end)]
        instants += [t for i in (*lane.waits, *lane.gaps) for t in (i.start, i.end)]
        instants += [m.at for m in lane.marks]
        instants += [t for span in lane.wait_spans for t in (span.start, span.end)]
        if lane.unrecorded is not None:
            instants.append(lane.unrecorded.start)
    instants += [m.at for m in run_marks]
    return Timeline(
        run_id=run.pk,
        start=min(instants),
        end=max(instants),
        open_ended=active,
        lanes=ordered,
        run_marks=sorted(run_marks, key=lambda m: m.at),
        events_cut=events_cut,
    )


def _lane_from_checkpoint(
    cp: StepCheckpoint, run: WorkflowRun, now: datetime, active: bool
) -> Lane:
    lane = Lane(
        seq=cp.seq,
        name=cp.name,
        kind=cp.kind,
        status=cp.status,
        first_started_at=cp.first_started_at,
    )
    end = cp.finished_at or cp.started_at
    if cp.status == StepStatus.COMPLETED:
        outcome = Outcome.COMPLETED
    elif cp.status == StepStatus.FAILED:
        outcome = Outcome.RETRIED if cp.retryable else Outcome.FAILED
        if cp.retryable and cp.retry_at is not None and active and cp.retry_at > end:
            lane.waits.append(Interval(start=end, end=cp.retry_at, note="back-off"))
    elif active:
        outcome, end = Outcome.RUNNING, max(now, cp.started_at)
    else:  # parked or cancelled under it: it stopped when the run did
        outcome, end = Outcome.INTERRUPTED, max(run.updated_at, cp.started_at)
    lane.attempts.append(
        Attempt(
            number=cp.attempts,
            fence=cp.fence,
            start=cp.started_at,
            end=end,
            outcome=outcome,
            owner=cp.lease_owner,
            error=_text(cp.error),
        )
    )
    return lane


def _add_events(lane: Lane, events: list[RunEvent]) -> None:
    """Earlier attempts, waits and gaps from the step's events, then its marks."""
    last = lane.attempts[0]  # the checkpoint's attempt, the only one so far
    earlier: list[Attempt] = []
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        if event.kind == RunEvent.Kind.ATTEMPT_FAILED:
            attempt = _failed_attempt(data, event.at)
            retry_at = _time(data.get("retry_at"))
            if retry_at is not None and retry_at > attempt.end:
                lane.waits.append(Interval(start=attempt.end, end=retry_at, note="back-off"))
            if _same(attempt, last):
                # The checkpoint's own attempt: keep its row, which knows the retry time too.
                continue
            earlier.append(attempt)
        elif event.kind == RunEvent.Kind.TAKEOVER:
            taken = _time(data.get("at")) or event.at  # the database's clock, when recorded
            lost = _lost_attempt(data, taken)
            if lost is not None:
                earlier.append(lost)
                reason = str(data.get("reason") or "owner lost").replace("_", " ")
                lane.gaps.append(Interval(start=lost.start, end=taken, note=reason))
        elif event.kind in MARK_KINDS:
            lane.marks.append(_mark(event))
    lane.attempts = sorted([*earlier, last], key=lambda a: a.start)
    lane.waits = _cut_short(_unique(lane.waits), lane.attempts)
    first_known = lane.attempts[0].start
    first = lane.first_started_at
    if first is not None and first_known - first > SAME_INSTANT:
        lane.unrecorded = Interval(
            start=first, end=first_known, note="earlier attempts, no details recorded"
        )


def _lane_of(event: RunEvent) -> int | None:
    """The step an event is drawn on: a divergence on the position that diverged (its event is
    about the task that found it, at a later position)."""
    if event.kind == RunEvent.Kind.DIVERGENCE and isinstance(event.data, dict):
        return _int(event.data.get("position")) or event.seq
    return event.seq


def _failed_attempt(data: Mapping[str, Any], at: datetime) -> Attempt:
    end = _time(data.get("ended_at")) or at
    # A step without a claim (read, db) records no start: its attempt is drawn at its end.
    start = _time(data.get("started_at")) or end
    retried = data.get("retry_at") is not None
    return Attempt(
        number=_int(data.get("attempt")),
        fence=_int(data.get("fence")),
        start=min(start, end),
        end=end,
        outcome=Outcome.RETRIED if retried else Outcome.FAILED,
        owner=_text(data.get("owner")),
        error=_text(data.get("error")),
    )


def _set_aside(row: SupersededStep) -> Attempt:
    """A superseded step's last attempt, drawn from its start to its end (or to the fork)."""
    end = row.finished_at or row.superseded_at
    start = min(row.started_at or end, end)
    return Attempt(
        number=row.attempts,
        start=start,
        end=end,
        outcome=Outcome.SUPERSEDED,
        error=_text(row.error),
    )


def _lost_attempt(data: Mapping[str, Any], at: datetime) -> Attempt | None:
    previous = data.get("previous")
    if not isinstance(previous, dict):
        return None
    start = _time(previous.get("started_at"))
    if start is None:
        return None
    return Attempt(
        number=_int(previous.get("attempt")),
        fence=_int(previous.get("fence")),
        start=min(start, at),
        # Its real end is unknown (the process died some time before the takeover noticed);
        # the picture draws it as a claim with the gap after it.
        end=min(start, at),
        outcome=Outcome.LOST,
        owner=_text(previous.get("owner")),
    )


def _same(told: Attempt, checkpoint: Attempt) -> bool:
    """Is the failed attempt an event tells of the one the checkpoint holds? Fences cannot say
    (a failure moves the checkpoint's fence on); both are stamped by the same database clock in
    the same transaction, so their times can."""
    if checkpoint.outcome not in (Outcome.RETRIED, Outcome.FAILED):
        return False
    return (
        abs(told.end - checkpoint.end) <= SAME_INSTANT
        or abs(told.start - checkpoint.start) <= SAME_INSTANT
    )


def _cut_short(waits: list[Interval], attempts: list[Attempt]) -> list[Interval]:
    """A wait ends when the next attempt starts, if that came before the planned retry time
    (an operator's Resume now, a retry made due early)."""
    cut = []
    for wait in waits:
        following = next((a.start for a in attempts if a.start >= wait.start), None)
        if following is not None and following < wait.end:
            wait = Interval(start=wait.start, end=following, note="back-off, cut short")
        cut.append(wait)
    return cut


def _unique(intervals: list[Interval]) -> list[Interval]:
    seen: dict[tuple[datetime, datetime], Interval] = {}
    for interval in intervals:
        seen.setdefault((interval.start, interval.end), interval)
    return sorted(seen.values(), key=lambda i: i.start)


def _mark(event: RunEvent) -> Mark:
    kind = MARK_KINDS[event.kind]
    label = event.get_kind_display()
    if event.actor and kind in (MarkKind.OPERATOR, MarkKind.FORK):
        label += f" ({event.actor})"
    if event.detail:
        label += f": {event.detail}"
    return Mark(at=event.at, kind=kind, label=_text(label))


def _time(value: Any) -> datetime | None:
    """An ISO-8601 time from event data, as an aware UTC datetime; None if absent or garbled."""
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
    else:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    with contextlib.suppress(TypeError, ValueError):
        return int(value)
    return None


def _text(value: Any) -> str:
    text = "" if value is None else str(value)
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS] + "…"
