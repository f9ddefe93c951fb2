"""Timed phases on real workers: plain Celery chains, agentflow runs, DBOS, commits per step, and
the worker's resident memory as the steps add up."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from celery import Signature, chain
from django.db import connection
from django.db.models import Count, Max
from django.utils import timezone

from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow.models import WorkflowRun
from agentflow.testing.processes import WorkerProcess, current_database_url
from config.bench import synthetic, workload
from config.bench.dbos_peer import DbosPeer

T = TypeVar("T")
#: How often the coordinator looks for the end of a phase. The end itself is stamped by the
#: workers (run `updated_at`, the chain's Redis timestamp), so this only bounds the wait.
POLL_SECONDS = 0.2


class BenchError(Exception):
    """The benchmark cannot run here, or a phase did not finish."""


@dataclass(frozen=True, kw_only=True)
class Throughput:
    runs: int
    steps: int
    seconds: float

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds

    @property
    def workflows_per_s(self) -> float:
        return self.runs / self.seconds

    @classmethod
    def total(cls, phases: Iterable[Throughput]) -> Throughput:
        phases = list(phases)
        return cls(
            runs=sum(p.runs for p in phases),
            steps=sum(p.steps for p in phases),
            seconds=sum(p.seconds for p in phases),
        )


@dataclass(frozen=True, kw_only=True)
class Commits:
    """Write transactions of one phase, counted by Postgres (transaction ids consumed)."""

    throughput: Throughput
    xids: int

    @property
    def per_step(self) -> float:
        # Each durable.start is one commit of its own; the rest belongs to the steps.
        return (self.xids - self.throughput.runs) / self.throughput.steps


@dataclass(kw_only=True)
class WorkerMemory:
    """The worker's resident memory (KiB) after so many agentflow steps, its parent apart
    from its pool processes, which run the steps: a leak is growth that goes on with the steps.

    Sampled after the warm-up runs and after every turn. Growth is counted from the end of the
    first turn: a process grows once while its first thousands of tasks fill caches and
    allocator pools (a pool process: +2 MiB in the first turn, then flat over 50,000 steps),
    and that is not a leak. The worker runs the plain and the hand-written chain's tasks too,
    as many as agentflow's steps: "per 10,000 steps" counts agentflow's alone."""

    #: (agentflow steps done, parent KiB, pool processes KiB together)
    samples: list[tuple[int, int, int]] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        warm = self.samples[1] if len(self.samples) > 2 else self.samples[0]
        (warm_steps, parent0, pool0), (steps, parent, pool) = warm, self.samples[-1]
        per_10k = 10_000 / (steps - warm_steps) if steps > warm_steps else 0.0
        return {
            "steps": steps,
            "rss_mib": _mib(parent + pool),
            "pool_rss_mib": _mib(pool),
            "parent_rss_mib": _mib(parent),
            "warmup_steps": warm_steps,
            "after_warmup_rss_mib": _mib(parent0 + pool0),
            "growth_mib": _mib(parent + pool - parent0 - pool0),
            "pool_growth_mib": _mib(pool - pool0),
            "parent_growth_mib": _mib(parent - parent0),
            "pool_growth_per_10k_steps_mib": _mib(round((pool - pool0) * per_10k)),
            "parent_growth_per_10k_steps_mib": _mib(round((parent - parent0) * per_10k)),
            "samples": [[done, _mib(a), _mib(b)] for done, a, b in self.samples],
        }


def _mib(kib: int) -> float:
    return round(kib / 1024, 1)


def worker_rss_kib(worker: WorkerProcess) -> tuple[int, int]:
    """VmRSS of the worker's parent, and of its pool processes together, from /proc (Linux)."""
    return _rss_kib(worker.pid), sum(_rss_kib(pid) for pid in worker.children())


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


def bench_worker(concurrency: int, *, beat: bool = False) -> WorkerProcess:
    """One worker, `-c concurrency` prefork processes, the project's Celery settings
    (prefetch 1, late acks), on this process's database and broker; no faults, and no beat
    unless asked (the recovery figures need the sweeper; throughput must not have it)."""
    return WorkerProcess(
        concurrency=concurrency,
        name=f"bench-{uuid.uuid4().hex[:6]}",
        env={
            "DATABASE_URL": current_database_url(),
            "CELERY_BROKER_URL": workload.broker_url(),
            "AGENTFLOW_FAULTS": "0",
            "AGENTFLOW_CRASH_AT": "",
        },
        beat=beat,
    )


def wait_until(check: Callable[[], T | None], *, timeout: float, what: Callable[[], str]) -> T:
    """Poll `check` until it returns a value; `what` describes the progress on a timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f} s waiting for {what()}")
        time.sleep(POLL_SECONDS)


def phase_timeout(steps: int) -> float:
    """Generous: a phase ten times slower than a loaded 2-core machine still finishes."""
    return 60.0 + steps / 20


# --- plain Celery chains -----------------------------------------------------------------------
def chain_throughput(chains: int) -> Throughput:
    """`chains` chains of STEPS no-op tasks, all published at once; the worker stamps the end."""

    def links(done_key: str) -> list[Signature]:
        return [
            *(workload.noop.si() for _ in range(workload.STEPS - 1)),
            workload.noop.si(done_key, chains),
        ]

    return _timed_chains(chains, links)


def naive_chain_throughput(chains: int) -> Throughput:
    """The yardstick: chains of STEPS tasks that each make two plain ORM commits, each chain on
    a run row created (by the ORM, one commit) just before it is published, as `durable.start`
    does for agentflow inside its timed phase."""
    return _run_chains(
        chains, partial(synthetic.yardstick_run_create, workload.NAIVE), workload.naive_link
    )


def floor_chain_throughput(chains: int) -> Throughput:
    """The protocol floor: chains of STEPS tasks that each make only the writes the protocol
    requires of their step, each chain on a run row created just before it is published."""
    return _run_chains(
        chains, partial(synthetic.floor_run_create, workload.FLOOR), workload.floor_link
    )


def _run_chains(chains: int, create_run: Callable[[], str], link: Any) -> Throughput:
    """Chains of STEPS `link(run_id, seq)` tasks, each on a run row of its own."""

    def links(done_key: str) -> list[Signature]:
        run_id = create_run()
        last = workload.STEPS
        return [
            link.si(run_id, seq, *((done_key, chains) if seq == last else ()))
            for seq in range(1, last + 1)
        ]

    return _timed_chains(chains, links)


def _timed_chains(chains: int, links: Callable[[str], list[Signature]]) -> Throughput:
    client = workload.redis_client()
    done_key = f"agentflow:bench:chains:{uuid.uuid4().hex}"
    try:
        started = time.time()
        for _ in range(chains):
            chain(*links(done_key)).apply_async()

        def finished() -> float | None:
            stamp = client.get(workload.done_at_key(done_key))
            return float(stamp) if stamp is not None else None

        ended = wait_until(
            finished,
            timeout=phase_timeout(chains * workload.STEPS),
            what=lambda: f"chains ({int(client.get(done_key) or 0)} of {chains} done)",
        )
    finally:
        client.delete(done_key, workload.done_at_key(done_key))
    return Throughput(runs=chains, steps=chains * workload.STEPS, seconds=ended - started)


# --- DBOS -----------------------------------------------------------------------------------------
def dbos_throughput(peer: DbosPeer, workflows: int) -> Throughput:
    """`workflows` DBOS workflows of STEPS no-op steps, from two threads or on its queue (the
    peer's mode)."""
    seconds = peer.run(workflows, timeout=phase_timeout(workflows * workload.STEPS))
    return Throughput(runs=workflows, steps=workflows * workload.STEPS, seconds=seconds)


# --- agentflow ----------------------------------------------------------------------------------
def workflow_throughput(workflow: str, runs: int) -> Throughput:
    """Start `runs` runs one by one (each commit publishes its first step) and wait for all.

    The end is the last run's `updated_at`, written by the worker in its completing commit.
    Only bench runs of `workflow` exist meanwhile (earlier ones are deleted first).
    """
    started = timezone.now()
    run_ids = [durable.start(workflow) for _ in range(runs)]
    _wait_finished(workflow, timeout=phase_timeout(runs * workload.STEPS))
    ours = WorkflowRun.objects.filter(pk__in=run_ids)
    for failed in ours.exclude(status=RunStatus.COMPLETED).values_list("id", "status", "error")[:1]:
        raise BenchError("bench run {} ended {}: {}".format(*failed))
    summary = ours.aggregate(completed=Count("id"), end=Max("updated_at"))
    if summary["completed"] != runs:
        raise BenchError(f"{runs - summary['completed']} {workflow} runs are missing")
    return Throughput(
        runs=runs, steps=runs * workload.STEPS, seconds=(summary["end"] - started).total_seconds()
    )


def _wait_finished(workflow: str, *, timeout: float) -> None:
    """Until no run of `workflow` is active. A failed run is not active either, so it ends the
    wait too and is reported after. The poll is served by the sweeper's small partial index:
    with a million finished runs present, anything else would be a table scan every poll,
    stealing a core from the workers being measured."""
    active = WorkflowRun.objects.filter(workflow=workflow, status__in=ACTIVE_RUN_STATUSES)

    def finished() -> bool | None:
        return None if active.order_by().exists() else True

    wait_until(finished, timeout=timeout, what=lambda: f"{active.count()} {workflow} runs")


def commits_per_step(workflow: str, runs: int) -> Commits:
    """Run a phase between two reads of Postgres's transaction counter.

    Every write transaction consumes one transaction id, read-only ones none, so the
    difference counts commits made by anyone: the bench workers run no beat or sweeper, and
    the coordinator only reads while it waits. Each read of the counter consumes one id too.
    """
    before = current_xid()
    throughput = workflow_throughput(workflow, runs)
    after = current_xid()
    return Commits(throughput=throughput, xids=after - before - 1)


def current_xid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()::text::bigint")
        return int(cursor.fetchone()[0])


def other_writers_per_s(seconds: float = 1.0) -> float:
    """Transaction ids consumed while the bench does nothing: other writers on the cluster
    (ids are cluster-wide), which would inflate the commit counts."""
    before = current_xid()
    time.sleep(seconds)
    return (current_xid() - before - 1) / seconds
