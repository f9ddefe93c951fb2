"""One bench run: check the environment, run every phase in order, and assemble the report."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import celery
import django
import psycopg
from celery import current_app as app
from django.conf import settings
from django.db import connection
from kombu.utils.url import maybe_sanitize_url

from agentflow import store
from agentflow.contrib.bench import takeover, workload
from agentflow.contrib.bench.agent_scale import POSITIONS, agent_scale
from agentflow.contrib.bench.purge import PurgeFigure, purge_at_scale
from agentflow.contrib.bench.sweep_scale import sweep_at_scale
from agentflow.contrib.bench.throughput import (
    BenchError,
    Commits,
    Throughput,
    bench_worker,
    chain_throughput,
    commits_per_step,
    naive_chain_throughput,
    other_writers_per_s,
    wait_until,
    workflow_throughput,
)
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.testing.processes import ProcessStartError

#: Small runs before the timed phases: worker imports, DB connections and broker channels.
WARMUP = 10


@dataclass(frozen=True, kw_only=True)
class BenchOptions:
    runs: int = 1000
    commit_runs: int = 100
    history: int = 1_000_000
    stale: int = 1000
    skip_sweep: bool = False
    #: Aged finished runs (each with its checkpoints and an event) purged alone, then again
    #: while agentflow runs; 0 skips the retention figures.
    purge_runs: int = 50_000
    concurrency: int = 2
    #: The plain chain, agentflow and the hand-written chain take turns this many times (each
    #: turn runs/rounds runs), so a slow spell of a shared machine slows all alike instead of
    #: skewing the ratios.
    rounds: int = 5
    #: Kills per recovery figure (a pool child; a whole worker while another one runs).
    child_kills: int = 5
    worker_kills: int = 10
    #: The lengths of the agent runs measured (empty: none).
    agent_positions: tuple[int, ...] = POSITIONS


def run_bench(options: BenchOptions, progress: Callable[[str], None] = lambda _: None) -> dict:
    """Every figure of SPEC §7 in one run, as one JSON-ready dict."""
    check_environment()
    report: dict[str, Any] = {"environment": environment(options), "sweep": None}
    if not options.skip_sweep:
        progress(f"sweeper query at {options.history:,} finished runs")
        figure = sweep_at_scale(history=options.history, stale=options.stale, progress=progress)
        report["sweep"] = asdict(figure)
    chain, mixed, naive, rounds, reads, effects, others, child, purged = _on_worker(
        options, progress
    )
    report["agentflow"] = {
        **_rates(mixed),
        "commits_per_read_step": round(reads.per_step, 3),
        "commits_per_effect_step": round(effects.per_step, 3),
        "step_overhead_ms": round(
            (1 / mixed.steps_per_s - 1 / chain.steps_per_s) * options.concurrency * 1000, 3
        ),
        "read_only_steps_per_s": round(reads.throughput.steps_per_s, 1),
        "effect_only_steps_per_s": round(effects.throughput.steps_per_s, 1),
        "commit_phases": {
            "runs": options.commit_runs,
            "steps_per_run": workload.STEPS,
            "read_xids": reads.xids,
            "effect_xids": effects.xids,
            "other_writers_xids_per_s": round(others, 1),
        },
    }
    report["celery_chain"] = _rates(chain)
    report["ratio"] = round(mixed.steps_per_s / chain.steps_per_s, 3)
    report["ratio_per_round"] = [
        round(flow.steps_per_s / plain.steps_per_s, 3) for plain, flow, _ in rounds
    ]
    report["naive_durable_chain"] = _rates(naive)
    report["ratio_to_naive"] = round(mixed.steps_per_s / naive.steps_per_s, 3)
    report["purge"] = purged.as_dict() if purged is not None else None
    report["agent_scale"], report["agent_memory"] = (
        agent_scale(options.agent_positions, progress=progress)
        if options.agent_positions
        else (None, None)
    )
    report["recovery"] = {"bound_s": takeover.bound_seconds()}
    if child is not None:
        report["recovery"]["child_kill"] = child.as_dict()
    if options.worker_kills:
        progress(f"recovery: {options.worker_kills} whole-worker kills, a second worker runs")
        try:
            whole = takeover.worker_kill_recovery(samples=options.worker_kills)
        finally:
            _delete_bench_runs()
        report["recovery"]["worker_kill"] = whole.as_dict()
    return report


def _on_worker(
    options: BenchOptions, progress: Callable[[str], None]
) -> tuple[
    Throughput,
    Throughput,
    Throughput,
    list[tuple[Throughput, Throughput, Throughput]],
    Commits,
    Commits,
    float,
    takeover.Recovery | None,
    PurgeFigure | None,
]:
    """The phases that need a worker, on one worker, from a clean queue and table."""
    _delete_bench_runs()
    _vacuum()
    purged = app.control.purge()
    if purged:
        progress(f"purged {purged} leftover messages")
    worker = bench_worker(options.concurrency)
    progress(f"starting worker -c {options.concurrency} (log: {worker.log_path})")
    try:
        worker.start(timeout=60)
        progress("warming up")
        chain_throughput(WARMUP)
        workflow_throughput(workload.MIXED, WARMUP)
        naive_chain_throughput(WARMUP)
        rounds = []
        for number, size in enumerate(_split(options.runs, options.rounds), start=1):
            progress(
                f"round {number}: plain Celery chain, {size} chains x {workload.STEPS} tasks; "
                f"agentflow, {size} runs x {workload.STEPS} steps; hand-written durable chain"
            )
            rounds.append(
                (
                    chain_throughput(size),
                    workflow_throughput(workload.MIXED, size),
                    naive_chain_throughput(size),
                )
            )
            _delete_bench_runs()
            _vacuum()  # each turn starts from the same clean tables, as autovacuum would keep them
        chain = Throughput.total(plain for plain, _, _ in rounds)
        mixed = Throughput.total(flow for _, flow, _ in rounds)
        naive = Throughput.total(hand for _, _, hand in rounds)
        wait_until(_queue_empty, timeout=30, what=lambda: "the broker queue to drain")
        idle_before = other_writers_per_s()
        progress(f"commits: {options.commit_runs} read-only and effect-only runs")
        reads = commits_per_step(workload.READ_ONLY, options.commit_runs)
        effects = commits_per_step(workload.EFFECT_ONLY, options.commit_runs)
        others = (idle_before + other_writers_per_s()) / 2
        purged = None
        if options.purge_runs:
            purged = purge_at_scale(
                runs=options.purge_runs,
                step_runs=_split(options.runs, options.rounds)[0],
                progress=progress,
            )
            _delete_bench_runs()
            _vacuum()
        child = None
        if options.child_kills:
            progress(f"recovery: {options.child_kills} pool-child kills")
            child = takeover.child_kill_recovery(worker, samples=options.child_kills)
    except (BenchError, ProcessStartError) as exc:
        raise BenchError(f"{exc}\nworker log ({worker.log_path}):\n{worker.log_tail()}") from None
    finally:
        worker.kill()
        _delete_bench_runs()
    worker.log_path.unlink(missing_ok=True)  # kept only when something went wrong
    return chain, mixed, naive, rounds, reads, effects, others, child, purged


def _split(total: int, parts: int) -> list[int]:
    """`total` in at most `parts` near-equal positive sizes."""
    parts = max(1, min(parts, total))
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


def _rates(throughput: Throughput) -> dict[str, Any]:
    return {
        "runs": throughput.runs,
        "steps": throughput.steps,
        "seconds": round(throughput.seconds, 3),
        "steps_per_s": round(throughput.steps_per_s, 1),
        "workflows_per_s": round(throughput.workflows_per_s, 2),
    }


def check_environment() -> None:
    """The figures need Postgres (transaction ids, the partial index at scale) and a Redis
    broker (the chain's completion counter); anything else is refused, not half-measured."""
    if connection.vendor != "postgresql":
        raise BenchError(
            f"bench needs Postgres, but the database is {connection.vendor}: "
            "set DATABASE_URL=postgres://... (commits per step are read from Postgres "
            "transaction ids, and the sweeper figure needs Postgres at a million rows)"
        )
    broker = workload.broker_url()
    if not broker.startswith(("redis://", "rediss://")):
        raise BenchError(
            f"bench needs a Redis broker, but the broker is {maybe_sanitize_url(broker)}: "
            "set CELERY_BROKER_URL=redis://..."
        )
    replies = app.control.inspect(timeout=1.0).ping()
    if replies:
        raise BenchError(
            f"other workers consume from this broker ({', '.join(sorted(replies))}); stop them "
            "first: they would take bench messages and their writes would skew the figures"
        )


def environment(options: BenchOptions) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        server = cursor.fetchone()[0]
        cursor.execute("SHOW synchronous_commit")
        synchronous_commit = cursor.fetchone()[0]
    db = connection.settings_dict
    return {
        "broker": maybe_sanitize_url(workload.broker_url()),
        "database": f"postgresql {server} {db['HOST'] or 'localhost'}/{db['NAME']}",
        "synchronous_commit": synchronous_commit,
        "workers": 1,
        "processes": options.concurrency,
        "rounds": options.rounds,
        "prefetch_multiplier": settings.CELERY_WORKER_PREFETCH_MULTIPLIER,
        "acks_late": settings.CELERY_TASK_ACKS_LATE,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "celery": celery.__version__,
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
    }


def _queue_empty() -> bool | None:
    with app.connection_for_write() as conn:
        # Not passive: kombu's Redis transport has no key for an empty queue.
        _, messages, _ = conn.default_channel.queue_declare(app.conf.task_default_queue)
    return True if messages == 0 else None


def _vacuum() -> None:
    """Start from tables without dead rows: autovacuum may be off or behind (it is off on
    some CI machines), and the rows of earlier bench runs would slow every index probe."""
    tables = ", ".join(model._meta.db_table for model in (WorkflowRun, StepCheckpoint, RunEvent))
    with connection.cursor() as cursor:
        cursor.execute(f"VACUUM (ANALYZE) {tables}")


def _delete_bench_runs() -> None:
    """Runs of an earlier, interrupted bench, or of this one; the reusable history stays."""
    store.runs_delete(workflows=workload.DISPOSABLE)
