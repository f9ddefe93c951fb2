"""Retention at scale (docs/protocol.md, "Retention"): purge rows/s beside the million-run history,
and the step throughput of agentflow runs while a purge goes on, against the same without one."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connections
from django.utils import timezone

from agentflow import _store as store
from agentflow._base.states import StepStatus
from agentflow.models import StepCheckpoint, WorkflowRun
from config.bench import synthetic, workload
from config.bench.throughput import BenchError, workflow_throughput

AGED_ID_PREFIX = "wf_benchaged_"
#: Aged runs were created from here on, one a second: long before any history run (those are
#: dated back from the moment they were inserted), so the purge never touches the history the
#: next bench run reuses. The purge still finds them as retention would: the oldest first,
#: through the created_at index.
AGED_FROM = datetime(2000, 1, 1, tzinfo=UTC)
#: Each aged run looks like a finished bench run: STEPS checkpoints and one event.
EVENTS_PER_RUN = 1
#: Runs per INSERT statement when cloning (their checkpoints: ten times as many rows).
CLONE_BATCH = 5000


#: Steps alone and steps beside a purge take turns this many times, so a slow spell of a shared
#: machine slows both alike (as the chain and agentflow take turns).
TURNS = 3


@dataclass(frozen=True, kw_only=True)
class PurgeRate:
    runs: int
    rows: int
    transactions: int
    seconds: float

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0

    @classmethod
    def total(cls, rates: list[PurgeRate]) -> PurgeRate:
        return cls(
            runs=sum(r.runs for r in rates),
            rows=sum(r.rows for r in rates),
            transactions=sum(r.transactions for r in rates),
            seconds=sum(r.seconds for r in rates),
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "rows": self.rows,
            "transactions": self.transactions,
            "seconds": round(self.seconds, 3),
            "rows_per_s": round(self.rows_per_s, 1),
        }


@dataclass(frozen=True, kw_only=True)
class StepsWindow:
    """Steps completed in a window of a step phase (by their checkpoints' finish times)."""

    steps: int
    seconds: float

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds if self.seconds else 0.0


@dataclass(frozen=True, kw_only=True)
class PurgeTurn:
    purge: PurgeRate
    #: While the purge ran, and over as long a window at the start of the phase before it.
    during: StepsWindow
    alone: StepsWindow


@dataclass(frozen=True, kw_only=True)
class PurgeFigure:
    #: Finished runs in the table while purging (the history, if the sweeper phase made it).
    finished_runs: int
    alone: PurgeRate
    turns: list[PurgeTurn]

    def as_dict(self) -> dict[str, Any]:
        alone = _steps_per_s([t.alone for t in self.turns])
        during = _steps_per_s([t.during for t in self.turns])
        return {
            "finished_runs": self.finished_runs,
            "rows_per_run": workload.STEPS + EVENTS_PER_RUN + 1,
            "alone": self.alone.as_dict(),
            "during_steps": PurgeRate.total([t.purge for t in self.turns]).as_dict(),
            "steps_per_s_alone": round(alone, 1),
            "steps_per_s_during_purge": round(during, 1),
            "steps_ratio_during_purge": round(during / alone, 3) if alone else None,
            "steps_ratio_per_turn": [
                round(t.during.steps_per_s / t.alone.steps_per_s, 3) if t.alone.steps else None
                for t in self.turns
            ],
            "window_seconds": round(sum(t.during.seconds for t in self.turns), 3),
        }


def _steps_per_s(windows: list[StepsWindow]) -> float:
    seconds = sum(w.seconds for w in windows)
    return sum(w.steps for w in windows) / seconds if seconds else 0.0


def purge_at_scale(
    *, runs: int, step_runs: int, progress: Callable[[str], None] = lambda _: None
) -> PurgeFigure:
    """Purge `runs` aged runs alone; then, TURNS times, `step_runs` agentflow runs alone and
    `step_runs` more while a third as many aged runs are purged. Needs a bench worker running.

    Steps/s beside the purge counts the steps completed (by their checkpoints' finish times)
    while the purge ran; the phase before it is counted over a window as long, from its start,
    so both are the busy part of a phase.
    """
    finished = WorkflowRun.objects.filter(workflow=workload.HISTORY).count()
    progress(f"retention: inserting {runs:,} aged finished runs with their rows")
    insert_aged(runs)
    progress("retention: purging them alone")
    alone = _timed_purge(runs)
    per_turn = max(1, runs // TURNS)
    turns = []
    for number in range(1, TURNS + 1):
        progress(
            f"retention turn {number}: {step_runs} agentflow runs alone, then {step_runs} "
            f"while {per_turn:,} aged runs are purged"
        )
        turns.append(_turn(per_turn, step_runs))
    return PurgeFigure(finished_runs=finished, alone=alone, turns=turns)


def _turn(aged: int, step_runs: int) -> PurgeTurn:
    alone_started = time.time()
    alone = workflow_throughput(workload.MIXED, step_runs)
    insert_aged(aged)
    purged: list[tuple[PurgeRate, float]] = []
    purger = threading.Thread(target=_purge_in_thread, args=(aged, purged), name="bench-purge")
    started = time.time()
    purger.start()
    try:
        steps = workflow_throughput(workload.MIXED, step_runs)
    finally:
        purger.join()
    if not purged:
        raise BenchError("the concurrent purge failed (see the log above)")
    purge, purge_ended = purged[0]
    window = min(purge_ended, started + steps.seconds) - started
    before = min(window, alone.seconds)
    turn = PurgeTurn(
        purge=purge,
        during=StepsWindow(steps=_steps_between(started, window), seconds=window),
        alone=StepsWindow(steps=_steps_between(alone_started, before), seconds=before),
    )
    store.runs_delete(workflows=[workload.MIXED])
    return turn


def _steps_between(started: float, seconds: float) -> int:
    return StepCheckpoint.objects.filter(
        run__workflow=workload.MIXED,
        status=StepStatus.COMPLETED,
        finished_at__gte=datetime.fromtimestamp(started, UTC),
        finished_at__lt=datetime.fromtimestamp(started + seconds, UTC),
    ).count()


def _purge_in_thread(runs: int, result: list[tuple[PurgeRate, float]]) -> None:
    try:
        result.append((_timed_purge(runs), time.time()))
    finally:
        connections.close_all()  # this thread's own connection


def _timed_purge(runs: int) -> PurgeRate:
    """The store's retention function, with the age that reaches exactly the aged runs."""
    newest_aged = AGED_FROM + timedelta(seconds=runs + 1)
    started = time.perf_counter()
    deleted = store.runs_purge(older_than=timezone.now() - newest_aged)
    seconds = time.perf_counter() - started
    if deleted.runs != runs:
        raise BenchError(f"the purge deleted {deleted.runs} runs, expected the {runs} aged ones")
    return PurgeRate(
        runs=deleted.runs, rows=deleted.rows, transactions=len(deleted.batches), seconds=seconds
    )


def insert_aged(runs: int) -> None:
    """`runs` finished runs created one second apart from AGED_FROM, each with STEPS
    checkpoints and an event: one template, cloned by SQL."""
    template = synthetic.finished_template(
        workflow=workload.AGED, steps=workload.STEPS, events=EVENTS_PER_RUN
    )
    try:
        for first in range(1, runs + 1, CLONE_BATCH):
            last = min(first + CLONE_BATCH - 1, runs)
            synthetic.runs_clone(
                template, prefix=AGED_ID_PREFIX, epoch=AGED_FROM, first=first, last=last
            )
    finally:
        store.runs_delete(ids=[template])
