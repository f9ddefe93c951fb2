"""Bench's partner-limit figures (issue 27): a limited step's throughput against its limit, on a
real worker, and the statements a limited call costs beside an unlimited one."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from django.db import connection
from django.test.utils import override_settings

from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow._core import pooler
from agentflow._limits.store import partner_forget
from agentflow.models import WorkflowRun
from config.bench import workload
from config.bench.throughput import BenchError, bench_worker, phase_timeout, wait_until

#: The partner key the bench limits (nobody else's).
PARTNER = "bench_partner"
#: Calls measured in-process per kind, for the statement counts.
COUNTED_CALLS = 50


@dataclass(frozen=True, kw_only=True)
class PartnerLimitFigure:
    rate_per_s: float
    runs: int
    concurrency: int
    #: Calls per second the limited step made, first call to last.
    calls_per_s: float
    ratio_to_limit: float
    #: The same runs of the same step on the same worker with the partner unlimited: what the
    #: machine can do at all (a limit above it cannot be reached, whatever the limiter does).
    unlimited_calls_per_s: float
    #: calls_per_s against the lower of the limit and that.
    ratio_to_reachable: float
    statements_per_unlimited_call: float
    statements_per_limited_call: float
    transactions_per_limited_call: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def limited_call(ctx: durable.StepContext) -> dict[str, Any]:
    """The bench's limited step: one call to the limited partner, timed when it goes."""
    with durable.partner_call(PARTNER, "call"):
        return {"at": time.time()}


limited = durable.Workflow(workload.LIMITED, version=1)
limited.step("call", kind="effect")(limited_call)


def partner_limit(
    *, rate: float, runs: int, concurrency: int, progress: Callable[[str], None]
) -> PartnerLimitFigure:
    _clean()
    progress(f"partner limit: statements per call ({COUNTED_CALLS} calls each)")
    unlimited = _statements_per_call(limited=False)
    counted_limited, transactions = _statements_per_call_limited()
    progress(f"partner limit: {runs} runs of the step, unlimited, {concurrency} procs")
    reachable = _calls_per_second(runs, concurrency, limits="{}", timeout=phase_timeout(runs))
    progress(f"partner limit: {runs} runs of one limited step at {rate:g}/s, {concurrency} procs")
    limited_limits = json.dumps({PARTNER: {"rate": f"{rate}/s"}})
    timeout = phase_timeout(runs) + runs / rate
    calls_per_s = _calls_per_second(runs, concurrency, limits=limited_limits, timeout=timeout)
    return PartnerLimitFigure(
        rate_per_s=rate,
        runs=runs,
        concurrency=concurrency,
        calls_per_s=round(calls_per_s, 2),
        ratio_to_limit=round(calls_per_s / rate, 3),
        unlimited_calls_per_s=round(reachable, 2),
        ratio_to_reachable=round(calls_per_s / min(rate, reachable), 3) if reachable else 0.0,
        statements_per_unlimited_call=unlimited,
        statements_per_limited_call=counted_limited,
        transactions_per_limited_call=transactions,
    )


def _calls_per_second(runs: int, concurrency: int, *, limits: str, timeout: float) -> float:
    """`runs` runs of the step started at once on a fresh worker with AGENTFLOW_PARTNER_LIMITS
    `limits`: the calls per second it made, first call to last."""
    worker = bench_worker(concurrency)
    worker.env["AGENTFLOW_PARTNER_LIMITS"] = limits
    worker.start(timeout=120)
    try:
        for _ in range(runs):
            durable.start(workload.LIMITED)
        active = WorkflowRun.objects.filter(
            workflow=workload.LIMITED, status__in=ACTIVE_RUN_STATUSES
        )
        wait_until(
            lambda: None if active.order_by().exists() else True,
            timeout=timeout,
            what=lambda: f"{active.count()} limited runs",
        )
    finally:
        worker.kill()
    done = WorkflowRun.objects.filter(workflow=workload.LIMITED)
    if done.exclude(status=RunStatus.COMPLETED).exists():
        raise BenchError("a limited bench run did not complete")
    times = sorted(float(o["at"]) for o in done.values_list("output", flat=True) if o)
    _clean()
    return (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0.0


def _statements_per_call(*, limited: bool) -> float:
    with _counting() as counts:
        for _ in range(COUNTED_CALLS):
            with durable.partner_call(PARTNER if limited else "bench_unlimited", "call"):
                pass
    return round(counts["statements"] / COUNTED_CALLS, 2)


def _statements_per_call_limited() -> tuple[float, float]:
    # A rate high enough that no call waits: the cost of taking and giving back a turn.
    fast = {PARTNER: {"rate": "100000/s"}}
    with override_settings(AGENTFLOW_PARTNER_LIMITS=fast), _counting() as counts:
        for _ in range(COUNTED_CALLS):
            with durable.partner_call(PARTNER, "call"):
                pass
    return (
        round(counts["statements"] / COUNTED_CALLS, 2),
        round(counts["commits"] / COUNTED_CALLS, 2),
    )


@contextmanager
def _counting() -> Iterator[dict[str, int]]:
    """Statements the store's cursor and Django's ran, and the commits, meanwhile."""
    counts = {"statements": 0, "commits": 0}
    original = pooler.Cursor.execute

    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        counts["statements"] += 1
        return original(self, *args, **kwargs)

    def django(execute_: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        counts["statements"] += 1
        return execute_(sql, params, many, context)

    connection.ensure_connection()
    raw = connection.connection
    commit = raw.commit

    def counted_commit() -> None:
        counts["commits"] += 1
        commit()

    pooler.Cursor.execute = execute  # type: ignore[method-assign]
    raw.commit = counted_commit
    try:
        with connection.execute_wrapper(django):
            yield counts
    finally:
        pooler.Cursor.execute = original  # type: ignore[method-assign]
        raw.commit = commit


def _clean() -> None:
    durable.delete_runs(
        WorkflowRun.objects.filter(workflow=workload.LIMITED).values_list("id", flat=True)
    )
    partner_forget(PARTNER)
