"""An agent run's trajectory as a conversation, branch by branch: its current calls, the
calls operators' forks set aside (history, never replayed), the divergence that led to a fork,
and what replay saved (`replays`).

A pure function of rows: the run, its checkpoints, its superseded steps and its events; each
row is read once (`calls.read_call`), defensively.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from agentflow._base.states import RunStatus, StepKind
from agentflow.admin import replays
from agentflow.admin.recorded_calls import (
    Call,
    Part,
    fingerprint,
    int_of,
    read_call,
    said,
    words,
)
from agentflow.admin.replays import Epochs, ForkRecord
from agentflow.agent.turns import whole_request
from agentflow.models import RunEvent, WorkflowRun


@dataclass(frozen=True, kw_only=True)
class Change:
    path: str
    recorded: str
    now: str


@dataclass(frozen=True, kw_only=True)
class DivergenceView:
    at: datetime
    position: int | None
    summary: str
    changes: list[Change]
    more: int
    #: The whole text, when the changes are not in the expected shape.
    text: str
    #: The fork that followed it, if one did.
    resolved_by: ForkRecord | None = None


@dataclass(kw_only=True)
class Branch:
    """Calls an operator's fork set aside: history, still shown, never replayed."""

    number: int
    calls: list[Call]
    fork: ForkRecord | None
    superseded_at: datetime | None
    #: The divergence the fork answered, if the branch had diverged.
    divergence: DivergenceView | None = None

    @property
    def positions(self) -> str:
        seqs = [c.position for c in self.calls]
        if not seqs:
            return "no positions"
        low, high = min(seqs), max(seqs)
        return f"position {low}" if low == high else f"positions {low}-{high}"

    @property
    def effects(self) -> list[Call]:
        return [c for c in self.calls if c.made_effect]

    @property
    def kept_effects(self) -> list[Call]:
        """Effects no later branch adopted: they happened; if the run fails, its compensation
        undoes them with the current branch's own."""
        return [c for c in self.effects if c.reused_at is None]


@dataclass(kw_only=True)
class Trajectory:
    calls: list[Call]
    #: Superseded branches, newest first.
    branches: list[Branch]
    #: The latest divergence (resolved by a fork or not).
    divergence: DivergenceView | None
    resumes: list[replays.Resume]
    saved: int
    #: Only the latest events were read: older resumes are not listed.
    events_cut: bool = False

    @property
    def turns(self) -> list[Call]:
        return [c for c in self.calls if c.part == Part.TURN]

    @property
    def tool_calls(self) -> int:
        return sum(1 for c in self.calls if c.part == Part.TOOL)

    @property
    def spent(self) -> int:
        """Tokens of this branch's model turns that were asked (an adopted turn was not)."""
        return sum(c.tokens.total for c in self.turns if c.tokens and not c.reused_key)

    @property
    def cost(self) -> Decimal | None:
        """Dollars this branch's asked model turns cost; None (unknown) when any of them has
        no price: a sum that left it out would read as the whole."""
        return _total(c.cost for c in self.turns if c.tokens and not c.reused_key)

    @property
    def cost_saved(self) -> Decimal | None:
        """Dollars replay did not spend again: each turn's recorded cost, as many times as it
        was handed back; None (unknown) when a turn handed back has no price."""
        handed_back = [c for c in self.turns if c.replayed]
        if any(c.cost is None for c in handed_back):
            return None
        return sum((c.cost * c.replayed for c in handed_back if c.cost), Decimal(0))

    @property
    def spent_superseded(self) -> int:
        return sum(
            c.tokens.total
            for branch in self.branches
            for c in branch.calls
            if c.part == Part.TURN and c.tokens and not c.reused_key
        )

    @property
    def next_position(self) -> int:
        return max((c.position for c in self.calls), default=0) + 1

    @property
    def open_divergence(self) -> DivergenceView | None:
        """The divergence no fork has answered yet."""
        found = self.divergence
        return found if found is not None and found.resolved_by is None else None


def _total(costs: Iterable[Decimal | None]) -> Decimal | None:
    total = Decimal(0)
    for cost in costs:
        if cost is None:
            return None
        total += cost
    return total


def looks_code_first(run: WorkflowRun, steps: Iterable[Any]) -> bool:
    """A run whose rows say it is an agent run (its definition may no longer be deployed)."""
    return run.branch > 0 or any(
        s.kind == StepKind.LLM
        or (isinstance(s.arguments, dict) and s.arguments.get("kind") in ("llm", "tool", "step"))
        for s in steps
    )


def build(
    run: WorkflowRun,
    steps: Sequence[Any],
    superseded: Sequence[Any],
    events: Iterable[RunEvent],
    *,
    events_cut: bool = False,
) -> Trajectory:
    """The run's conversation: its current branch, then the branches forks set aside."""
    events = list(events)
    forks = [_fork(e) for e in events if e.kind == RunEvent.Kind.FORK]
    forks += _untold_forks(superseded, told={f.branch for f in forks})
    epochs = Epochs.of(forks)
    views = branch_views(run.branch, steps, superseded, {f.branch: f for f in forks})
    calls: dict[int, Call] = {}  # by id() of the row: each row is read once
    for number in sorted(views):
        _read_view(views[number], calls)
    for row in superseded:  # of a branch no fork event explains (odd data): read on its own
        if id(row) not in calls:
            calls[id(row)] = read_call(row)
    saved, resumes = replays.account(
        views=views,
        calls=calls,
        events=events,
        epochs=epochs,
        current=run.branch,
        finished=run.status == RunStatus.COMPLETED,
    )
    divergences = [_divergence(e, epochs) for e in events if e.kind == RunEvent.Kind.DIVERGENCE]
    current = [calls[id(row)] for row in sorted(steps, key=lambda s: s.seq)]
    effects = {s.idempotency_key for s in superseded if s.kind == StepKind.EFFECT}
    adopted = {c.reused_key: c.position for c in current if c.reused_key}
    for call in current:
        if call.reused_key in effects:
            call.effect = True  # adopted as a read of the recorded result; it was an effect
    branches = []
    for number in sorted({s.branch for s in superseded}, reverse=True):
        rows = sorted((s for s in superseded if s.branch == number), key=lambda s: s.seq)
        fork = next((f for f in forks if f.branch == number + 1), None)
        branch = Branch(
            number=number,
            calls=[calls[id(s)] for s in rows],
            fork=fork,
            superseded_at=rows[0].superseded_at,
            divergence=next(
                (d for d in reversed(divergences) if fork and d.resolved_by is fork), None
            ),
        )
        for call in branch.calls:
            call.reused_at = adopted.get(call.key)
        branches.append(branch)
    return Trajectory(
        calls=current,
        branches=branches,
        divergence=divergences[-1] if divergences else None,
        resumes=resumes,
        saved=saved,
        events_cut=events_cut,
    )


def branch_views(
    current: int,
    steps: Sequence[Any],
    superseded: Sequence[Any],
    forks: Mapping[int | None, ForkRecord],
) -> dict[int, dict[int, Any]]:
    """Each branch's calls by position, as that branch saw them. A fork keeps the calls before
    its position, so a branch's view is its own set-aside calls over the next branch's view
    below the fork's position."""
    views: dict[int, dict[int, Any]] = {current: {row.seq: row for row in steps}}
    for number in range(current - 1, -1, -1):
        own = {s.seq: s for s in superseded if s.branch == number}
        fork = forks.get(number + 1)
        position = fork.position if fork is not None and fork.position else min(own, default=1)
        below = {seq: row for seq, row in views[number + 1].items() if seq < position}
        views[number] = {**below, **own}
    return views


def _read_view(view: Mapping[int, Any], calls: dict[int, Call]) -> None:
    """Read a branch's rows in order: a turn's new messages are those the turn before it did
    not send (every system and user message, for the first); each turn's whole conversation is
    its stored delta over the turn before's."""
    sent: set[str] = set()
    turn = 0
    request: dict[str, Any] | None = None  # the turn before's, rebuilt whole from the deltas
    for seq in sorted(view):
        row = view[seq]
        call = calls.get(id(row))
        if call is None:
            call = calls[id(row)] = read_call(row)
        if call.part != Part.TURN:
            continue
        turn += 1
        recorded = fingerprint(row)
        request = whole_request(recorded.get("arguments") if recorded else None, request)
        conversation = [m for m in request["messages"] if isinstance(m, dict)] if request else []
        if call.turn is None:  # a row two branches share was read with the same history
            call.turn = turn
            call.added = [
                said(m)
                for m in conversation
                if m.get("role") not in ("assistant", "tool") and _key(m) not in sent
            ]
        sent = {_key(m) for m in conversation}


def _key(message: dict[str, Any]) -> str:
    return json.dumps(message, sort_keys=True, default=str)


def _untold_forks(superseded: Sequence[Any], *, told: set[int | None]) -> list[ForkRecord]:
    """Forks whose event was not read (older than the events a page reads), from the steps they
    set aside: when and from where, not by whom."""
    found = []
    for number in sorted({s.branch for s in superseded} - {b - 1 for b in told if b}):
        rows = [s for s in superseded if s.branch == number]
        found.append(
            ForkRecord(
                at=min(s.superseded_at for s in rows),
                actor="",
                reason="",
                position=min(s.seq for s in rows),
                branch=number + 1,
            )
        )
    return found


def _fork(event: RunEvent) -> ForkRecord:
    data = event.data if isinstance(event.data, dict) else {}
    return ForkRecord(
        at=event.at,
        actor=event.actor,
        reason=event.detail,
        position=int_of(data.get("position")),
        branch=int_of(data.get("branch")),
    )


def _divergence(event: RunEvent, epochs: Epochs) -> DivergenceView:
    data = event.data if isinstance(event.data, dict) else {}
    listed = data.get("changes")
    changes = [
        Change(
            path=words(change.get("path")),
            recorded=words(change.get("recorded")),
            now=words(change.get("now")),
        )
        for change in (listed if isinstance(listed, list) else [])
        if isinstance(change, dict)
    ]
    return DivergenceView(
        at=event.at,
        position=int_of(data.get("position")),
        summary=words(data.get("summary")) or words(event.detail).split("\n")[0],
        changes=changes,
        more=int_of(data.get("more")) or 0,
        text="" if changes else words(data.get("text") or event.detail),
        resolved_by=epochs.fork_after(event.at),
    )
