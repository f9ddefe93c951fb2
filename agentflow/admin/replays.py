"""What replay saved an agent run: the model turns it handed back instead of asking again,
and the resumes (a later attempt, a takeover, a sweeper's re-publish) that replayed them.

Every task of an agent run replays its function from the top: the task at position q hands
back every recorded call before q without asking the model or calling a tool. So each turn is
replayed once per task execution at a later position — every attempt of every later call, the
task that found the function's answer, and a task that found a divergence — and its recorded
usage is what each of those replays did not spend. Executions are counted from the checkpoints'
attempts in the branch each task saw (a fork keeps the calls before its position, so a
superseded call's history is its branch's: see `trajectory.branch_views`). The figure is a
floor: an operator's retry restarts a checkpoint's attempt count, and the task that found the
function raising (then compensating) is told by no row of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentflow.admin.recorded_calls import REPLAYED_PARTS, Call, Part, int_of, text_of
from agentflow.models import RunEvent

#: Events that tell how a call's later attempt came about.
_CAUSES = (RunEvent.Kind.TAKEOVER, RunEvent.Kind.ATTEMPT_FAILED, RunEvent.Kind.SWEEP_REQUEUE)
_TAKEOVER_WORDS = {
    "owner_gone": "its worker was gone",
    "lease_expired": "its worker's lease ran out",
    "operator": "an operator's retry released it",
}
#: A failed attempt's error is quoted up to this many characters.
ERROR_CHARS = 160


@dataclass(frozen=True, kw_only=True)
class ForkRecord:
    at: datetime
    actor: str
    reason: str
    position: int | None
    #: The branch the fork started (the one before it is what it set aside).
    branch: int | None


@dataclass(frozen=True)
class Epochs:
    """Which branch was live when: forks in time order."""

    forks: tuple[ForkRecord, ...]

    @classmethod
    def of(cls, forks: Iterable[ForkRecord]) -> Epochs:
        return cls(tuple(sorted(forks, key=lambda f: f.at)))

    def branch_at(self, at: datetime) -> int:
        branch = 0
        for index, fork in enumerate(self.forks, start=1):
            if fork.at <= at:
                branch = fork.branch if fork.branch is not None else index
        return branch

    def fork_after(self, at: datetime) -> ForkRecord | None:
        return next((f for f in self.forks if f.at >= at), None)


@dataclass(frozen=True, kw_only=True)
class Resume:
    """One resumed task: which attempt of which position, why, and what its replay handed back."""

    position: int
    #: None: a sweeper's re-publish whose attempt is told by no record.
    attempt: int | None
    cause: str
    at: datetime | None
    #: The superseded branch it happened in, or None for the current one.
    branch: int | None
    turns: int
    tokens: int
    tool_calls: int

    @property
    def text(self) -> str:
        who = (
            f"attempt {self.attempt} of position {self.position}"
            if self.attempt is not None
            else f"the task for position {self.position}"
        )
        if self.position <= 1:
            return f"{who} had nothing to replay: it is the run's first call"
        span = "position 1" if self.position == 2 else f"positions 1-{self.position - 1}"
        turns = f"{self.turns} model turn{'s' if self.turns != 1 else ''}"
        tools = f", {self.tool_calls} tool call{'s' if self.tool_calls != 1 else ''}"
        return (
            f"{who} replayed {span} ({turns}, {self.tokens:,} tokens"
            f"{tools if self.tool_calls else ''}) without asking the model or calling a tool"
        )


def account(
    *,
    views: Mapping[int, Mapping[int, Any]],
    calls: Mapping[int, Call],
    events: Sequence[RunEvent],
    epochs: Epochs,
    current: int,
    finished: bool,
) -> tuple[int, list[Resume]]:
    """Tokens saved by replay in all (each call's `replayed` and `saved` filled in on the way),
    and the resumes, in time order where known."""
    told = _events_by_row(views, events, epochs)
    saved = 0
    resumes: list[Resume] = []
    counted: set[int] = set()
    for number in sorted(views, reverse=True):
        view = views[number]
        for seq, row in sorted(view.items()):
            call = calls[id(row)]
            if id(row) in counted or call.part not in REPLAYED_PARTS:
                continue
            counted.add(id(row))
            history = _history(view, calls, before=seq)
            saved += _hand_back(history, times=max(call.attempts, 1))
            branch = None if number == current else number
            resumes += _resumes(call, told.get(id(row), []), history, branch)
    if finished:  # the task that replayed every call and saw the function return
        saved += _hand_back(_history(views[current], calls, before=None), times=1)
    for event in events:
        if event.kind == RunEvent.Kind.DIVERGENCE:
            data = event.data if isinstance(event.data, dict) else {}
            position = int_of(data.get("position"))
            seen = views.get(epochs.branch_at(event.at))
            if position is not None and seen is not None:
                saved += _hand_back(_history(seen, calls, before=position), times=1)
    resumes.sort(key=lambda r: (r.at is None, r.at.timestamp() if r.at else 0.0, r.position))
    return saved, resumes


def _history(
    view: Mapping[int, Any], calls: Mapping[int, Call], *, before: int | None
) -> list[Call]:
    return [
        calls[id(row)]
        for seq, row in sorted(view.items())
        if (before is None or seq < before) and calls[id(row)].part in REPLAYED_PARTS
    ]


def _hand_back(history: list[Call], *, times: int) -> int:
    saved = 0
    for call in history:
        call.replayed += times
        if call.part == Part.TURN and call.tokens is not None:
            call.saved += call.tokens.total * times
            saved += call.tokens.total * times
    return saved


def _events_by_row(
    views: Mapping[int, Mapping[int, Any]], events: Sequence[RunEvent], epochs: Epochs
) -> dict[int, list[RunEvent]]:
    """Takeovers, failed attempts and sweeps, by the row (in the branch then live) they were
    about."""
    found: dict[int, list[RunEvent]] = {}
    for event in events:
        if event.kind not in _CAUSES or event.seq is None:
            continue
        row = views.get(epochs.branch_at(event.at), {}).get(event.seq)
        if row is not None:
            found.setdefault(id(row), []).append(event)
    return found


def _resumes(
    call: Call, events: list[RunEvent], history: list[Call], branch: int | None
) -> list[Resume]:
    turns = [c for c in history if c.part == Part.TURN]

    def resume(attempt: int | None, cause: str, at: datetime | None) -> Resume:
        return Resume(
            position=call.position,
            attempt=attempt,
            cause=cause,
            at=at,
            branch=branch,
            turns=len(turns),
            tokens=sum(c.tokens.total for c in turns if c.tokens is not None),
            tool_calls=sum(1 for c in history if c.part == Part.TOOL),
        )

    takeovers: dict[int, RunEvent] = {}
    failures: dict[int, RunEvent] = {}
    sweeps: list[RunEvent] = []
    for event in events:
        data = event.data if isinstance(event.data, dict) else {}
        attempt = int_of(data.get("attempt"))
        if event.kind == RunEvent.Kind.TAKEOVER and attempt is not None:
            takeovers[attempt] = event
        elif event.kind == RunEvent.Kind.ATTEMPT_FAILED and attempt is not None:
            failures[attempt] = event
        elif event.kind == RunEvent.Kind.SWEEP_REQUEUE:
            sweeps.append(event)
    found = []
    attempts = set(range(2, call.attempts + 1)) | set(takeovers)  # a retry restarts the count
    for attempt in sorted(attempts):
        cause, at = "another delivery of its message", None
        if attempt in takeovers:
            event = takeovers[attempt]
            data = event.data if isinstance(event.data, dict) else {}
            reason = text_of(data.get("reason"))
            cause = f"took over: {_TAKEOVER_WORDS.get(reason, reason or 'its owner was lost')}"
            at = event.at
            earlier = [e.at for n, e in (*takeovers.items(), *failures.items()) if n < attempt]
            since = max(earlier, default=None)
            swept = [s for s in sweeps if s.at <= event.at and (since is None or s.at > since)]
            if swept:
                sweeps.remove(swept[-1])
                cause = f"re-published by the sweeper, then {cause}"
        elif attempt - 1 in failures:
            event = failures[attempt - 1]
            data = event.data if isinstance(event.data, dict) else {}
            error = text_of(data.get("error"))
            if len(error) > ERROR_CHARS:
                error = error[:ERROR_CHARS] + "…"
            cause = f"a retry: attempt {attempt - 1} failed ({error or 'no error recorded'})"
            until = failures[attempt].at if attempt in failures else None
            swept = [s for s in sweeps if s.at >= event.at and (until is None or s.at < until)]
            if swept:  # the retry came due and the sweeper published it
                sweeps.remove(swept[0])
                cause += ", re-published by the sweeper"
        found.append(resume(attempt, cause, at))
    for sweep in sweeps:  # a lost message, or a retry that came due: no later attempt tells it
        found.append(resume(None, f"re-published by the sweeper: {sweep.detail}", sweep.at))
    return found
