"""The sweeper's query at scale: its cost must follow active runs, not finished history."""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction

from agentflow import _store as store
from agentflow._base.states import TERMINAL_RUN_STATUSES, RunStatus
from agentflow._conf import settings
from agentflow.models import WorkflowRun
from config.bench import synthetic, workload
from config.bench.scrape import ScrapeFigure, scrape_at_scale

#: Rows per INSERT statement: keeps each transaction and its WAL burst bounded.
INSERT_BATCH = 250_000
HISTORY_ID_PREFIX = "wf_benchhistory_"
STALE_ID_PREFIX = "wf_benchstale_"
REPETITIONS = 7
INDEX = "run_sweep_due"


@dataclass(frozen=True, kw_only=True)
class SweepFigure:
    finished_runs: int
    history_inserted: int
    stale_runs: int
    due_found: int
    limit: int
    query_ms: float
    query_ms_samples: list[float]
    #: The server's share of one query (EXPLAIN ANALYZE); the rest is Django and the driver.
    plan_execution_ms: float | None
    uses_partial_index: bool
    plan: str
    #: One /metrics scrape with the same history and due runs present.
    scrape: ScrapeFigure


def sweep_at_scale(
    *, history: int, stale: int, progress: Callable[[str], None] = lambda _: None
) -> SweepFigure:
    """Time the sweeper's own query with `history` finished runs and `stale` due ones present.

    The finished runs are kept for the next bench run (inserting a million rows is the slow
    part); the stale runs are deleted again, and the timed queries are rolled back so nothing
    is re-enqueued.
    """
    inserted = ensure_history(history, progress=progress)
    try:
        _insert(STALE_ID_PREFIX, workload.STALE, RunStatus.RUNNING, 1, stale, stale=True)
        progress("VACUUM ANALYZE")
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE {WorkflowRun._meta.db_table}")
        if inserted:
            _checkpoint()
        limit = settings.AGENTFLOW_SWEEP_BATCH
        samples, found = [], 0
        for _ in range(REPETITIONS):
            with transaction.atomic():
                started = time.perf_counter()
                found = len(store.sweep_due(limit))
                samples.append((time.perf_counter() - started) * 1000)
                transaction.set_rollback(True)
        plan = _explain(limit)
        progress(f"one /metrics scrape at {history:,} finished runs")
        scrape = scrape_at_scale()
    finally:
        store.runs_delete(workflows=[workload.STALE])
    finished = WorkflowRun.objects.filter(status__in=TERMINAL_RUN_STATUSES).count()
    return SweepFigure(
        finished_runs=finished,
        history_inserted=inserted,
        stale_runs=stale,
        due_found=found,
        limit=limit,
        query_ms=round(statistics.median(samples), 3),
        query_ms_samples=[round(ms, 3) for ms in samples],
        plan_execution_ms=_execution_ms(plan),
        uses_partial_index=INDEX in plan,
        plan=plan,
        scrape=scrape,
    )


def _explain(limit: int) -> str:
    """EXPLAIN ANALYZE of each of the sweeper's queries, rolled back."""
    plans = []
    with transaction.atomic(), connection.cursor() as cursor:
        for reason, query, params in store.sweep_statements(limit):
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {query}", params)
            plans.append(f"-- {reason}\n" + "\n".join(row[0] for row in cursor.fetchall()))
        transaction.set_rollback(True)
    return "\n".join(plans)


def _checkpoint() -> None:
    """Flush the insert's dirty pages now rather than during the timed phases that follow.
    Needs superuser or pg_checkpoint; without it the flush just happens later."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("CHECKPOINT")
    except DatabaseError:
        pass


def _execution_ms(plan: str) -> float | None:
    found = re.findall(r"^Execution Time: ([0-9.]+) ms", plan, re.MULTILINE)
    return round(sum(float(ms) for ms in found), 3) if found else None


def ensure_history(count: int, *, progress: Callable[[str], None] = lambda _: None) -> int:
    """Make sure `count` finished bench runs exist; return how many were inserted now."""
    present = WorkflowRun.objects.filter(workflow=workload.HISTORY).count()
    if present >= count:
        return 0
    inserted = 0
    for first in range(1, count + 1, INSERT_BATCH):
        last = min(first + INSERT_BATCH - 1, count)
        progress(f"inserting finished runs {first:,}-{last:,} of {count:,}")
        inserted += _insert(
            HISTORY_ID_PREFIX, workload.HISTORY, RunStatus.COMPLETED, first, last, stale=False
        )
    return inserted


def _insert(prefix: str, workflow: str, status: str, first: int, last: int, *, stale: bool) -> int:
    if stale:  # active: due a minute ago, as if its worker died
        wake_at = "now() - interval '1 minute' - g * interval '1 millisecond'"
        created_at = "now() - interval '1 hour'"
    else:  # finished: no wake-up time, spread over the past
        wake_at = "NULL"
        created_at = "now() - g * interval '1 second'"
    return synthetic.runs_insert(
        prefix=prefix,
        workflow=workflow,
        status=status,
        first=first,
        last=last,
        at_step=("step_9", 11),
        wake_at=wake_at,
        created_at=created_at,
    )
