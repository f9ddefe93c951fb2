"""One bench run: check the environment, run every phase in order, and assemble the report."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import celery
import django
import psycopg
from celery import current_app as app
from django.conf import settings
from django.db import connection
from kombu.utils.url import maybe_sanitize_url

from agentflow import _store as store
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.testing.processes import ProcessStartError
from config.bench import dbos_peer, partner_limit, starts, step_cost, takeover, workload
from config.bench.agent_scale import POSITIONS, agent_scale
from config.bench.cpu import CpuMeter, CpuPerStep
from config.bench.purge import PurgeFigure, purge_at_scale
from config.bench.sweep_scale import sweep_at_scale
from config.bench.throughput import (
    BenchError,
    Commits,
    Throughput,
    WorkerMemory,
    bench_worker,
    chain_throughput,
    commits_per_step,
    dbos_throughput,
    floor_chain_throughput,
    naive_chain_throughput,
    other_writers_per_s,
    wait_until,
    worker_rss_kib,
    workflow_throughput,
)

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
    #: The limited step's rate (calls/s; 0 skips the partner-limit figures) and its runs.
    partner_rate: float = 50.0
    partner_runs: int = 300
    #: Only the partner-limit figures.
    partner_only: bool = False
    #: Runs started one by one and in bulk (0: skip that figure); only that figure.
    start_runs: int = 10_000
    starts_only: bool = False
    #: Runs of the step-cost figure, in this process (0: skip it); only that figure.
    step_cost_runs: int = 200
    step_cost_only: bool = False


def run_bench(options: BenchOptions, progress: Callable[[str], None] = lambda _: None) -> dict:
    """Every figure of docs/figures/bench.md in one run, as one JSON-ready dict."""
    check_environment()
    report: dict[str, Any] = {"environment": environment(options), "sweep": None}
    if options.partner_only:
        return {**report, "partner_limit": _partner_limit(options, progress)}
    if options.starts_only:
        return {**report, "starts": starts.starts(options.start_runs, progress)}
    if options.step_cost_only:
        return {**report, "step_cost": step_cost.step_cost(options.step_cost_runs, progress)}
    if not options.skip_sweep:
        progress(f"sweeper query at {options.history:,} finished runs")
        figure = sweep_at_scale(history=options.history, stale=options.stale, progress=progress)
        report["sweep"] = asdict(figure)
    done = _on_worker(options, progress)
    chain, mixed, naive = done.total("chain"), done.total("flow"), done.total("naive")
    floor = done.total("floor")
    dbos, dbos_queue = done.total("dbos"), done.total("dbos_queue")
    reads, effects = done.reads, done.effects
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
            "other_writers_xids_per_s": round(done.others, 1),
        },
        "worker_memory": done.memory.as_dict(),
    }
    report["celery_chain"] = _rates(chain)
    report["ratio"] = round(mixed.steps_per_s / chain.steps_per_s, 3)
    report["ratio_per_round"] = done.ratios("flow", "chain")
    report["protocol_floor_chain"] = _rates(floor)
    report["ratio_floor_to_chain"] = round(floor.steps_per_s / chain.steps_per_s, 3)
    report["ratio_floor_to_chain_per_round"] = done.ratios("floor", "chain")
    report["ratio_to_floor"] = round(mixed.steps_per_s / floor.steps_per_s, 3)
    report["naive_durable_chain"] = _rates(naive)
    report["ratio_to_naive"] = round(mixed.steps_per_s / naive.steps_per_s, 3)
    report["dbos"] = {
        "version": done.dbos_version,
        "threads": dbos_peer.THREADS,
        "queue_concurrency": dbos_peer.QUEUE_CONCURRENCY,
        "queue_polling_s": dbos_peer.QUEUE_POLLING_SECONDS,
        "steps_per_s": round(dbos.steps_per_s, 1),
        "workflows_per_s": round(dbos.workflows_per_s, 2),
        "queue_steps_per_s": round(dbos_queue.steps_per_s, 1),
        "queue_workflows_per_s": round(dbos_queue.workflows_per_s, 2),
    }
    report["ratio_to_dbos"] = round(mixed.steps_per_s / dbos.steps_per_s, 3)
    report["ratio_to_dbos_per_round"] = done.ratios("flow", "dbos")
    report["ratio_to_dbos_queue"] = round(mixed.steps_per_s / dbos_queue.steps_per_s, 3)
    report["cpu_ms_per_step"] = {name: figure.as_dict() for name, figure in done.cpu.items()}
    purged, child = done.purged, done.child
    report["purge"] = purged.as_dict() if purged is not None else None
    report["agent_scale"], report["agent_memory"] = (
        agent_scale(options.agent_positions, progress=progress)
        if options.agent_positions
        else (None, None)
    )
    report["partner_limit"] = _partner_limit(options, progress) if options.partner_rate else None
    report["starts"] = starts.starts(options.start_runs, progress) if options.start_runs else None
    report["step_cost"] = (
        step_cost.step_cost(options.step_cost_runs, progress) if options.step_cost_runs else None
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


def _partner_limit(options: BenchOptions, progress: Callable[[str], None]) -> dict[str, Any]:
    return partner_limit.partner_limit(
        rate=options.partner_rate or 50.0,
        runs=options.partner_runs,
        concurrency=options.concurrency,
        progress=progress,
    ).as_dict()


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One turn of each contender, back to back, so a slow spell slows them all alike."""

    chain: Throughput
    flow: Throughput
    naive: Throughput
    floor: Throughput
    dbos: Throughput
    dbos_queue: Throughput


@dataclass(frozen=True, kw_only=True)
class WorkerFigures:
    turns: list[Turn]
    reads: Commits
    effects: Commits
    others: float
    memory: WorkerMemory
    dbos_version: str
    child: takeover.Recovery | None
    purged: PurgeFigure | None
    cpu: dict[str, CpuPerStep]

    def total(self, contender: str) -> Throughput:
        return Throughput.total(getattr(turn, contender) for turn in self.turns)

    def ratios(self, contender: str, to: str) -> list[float]:
        return [
            round(getattr(turn, contender).steps_per_s / getattr(turn, to).steps_per_s, 3)
            for turn in self.turns
        ]


def _on_worker(options: BenchOptions, progress: Callable[[str], None]) -> WorkerFigures:
    """The phases that need a worker, on one worker, from a clean queue and table; DBOS takes
    its turns in two processes of its own beside it (one a mode), stopped outside them."""
    _delete_bench_runs()
    _vacuum()
    purged = app.control.purge()
    if purged:
        progress(f"purged {purged} leftover messages")
    worker = bench_worker(options.concurrency)
    threads, queue = (
        dbos_peer.DbosPeer(_conninfo(), steps=workload.STEPS, mode=mode) for mode in dbos_peer.MODES
    )
    progress(f"starting worker -c {options.concurrency} (log: {worker.log_path}) and DBOS")
    try:
        worker.start(timeout=60)
        threads.start()
        queue.start()
        progress(f"warming up (DBOS {threads.version})")
        chain_throughput(WARMUP)
        workflow_throughput(workload.MIXED, WARMUP)
        naive_chain_throughput(WARMUP)
        floor_chain_throughput(WARMUP)
        dbos_throughput(threads, WARMUP)
        dbos_throughput(queue, WARMUP)
        memory = WorkerMemory(samples=[(0, *worker_rss_kib(worker))])
        ours = connection.settings_dict["NAME"]
        cpu = {
            name: CpuMeter(own=lambda: [worker.pid, *worker.children()], dbname=ours)
            for name in ("chain", "flow", "naive", "floor")
        } | {
            "dbos": CpuMeter(own=threads.pids, dbname=threads.dbname),
            "dbos_queue": CpuMeter(own=queue.pids, dbname=queue.dbname),
        }
        turns, steps = [], 0
        for number, size in enumerate(_split(options.runs, options.rounds), start=1):
            progress(
                f"round {number}: plain Celery chain, {size} chains x {workload.STEPS} tasks; "
                f"agentflow, {size} runs x {workload.STEPS} steps; hand-written durable chain; "
                "the protocol floor; "
                f"DBOS, {size} workflows from {dbos_peer.THREADS} threads, then on its queue"
            )
            turns.append(
                Turn(
                    chain=cpu["chain"].measure(partial(chain_throughput, size)),
                    flow=cpu["flow"].measure(partial(workflow_throughput, workload.MIXED, size)),
                    naive=cpu["naive"].measure(partial(naive_chain_throughput, size)),
                    floor=cpu["floor"].measure(partial(floor_chain_throughput, size)),
                    dbos=cpu["dbos"].measure(partial(dbos_throughput, threads, size)),
                    dbos_queue=cpu["dbos_queue"].measure(partial(dbos_throughput, queue, size)),
                )
            )
            steps += size * workload.STEPS
            memory.samples.append((steps, *worker_rss_kib(worker)))
            _delete_bench_runs()
            _vacuum()  # each turn starts from the same clean tables, as autovacuum would keep them
        threads.stop()
        queue.stop()
        wait_until(_queue_empty, timeout=30, what=lambda: "the broker queue to drain")
        idle_before = other_writers_per_s()
        progress(f"commits: {options.commit_runs} read-only and effect-only runs")
        reads = commits_per_step(workload.READ_ONLY, options.commit_runs)
        effects = commits_per_step(workload.EFFECT_ONLY, options.commit_runs)
        others = (idle_before + other_writers_per_s()) / 2
        purge = None
        if options.purge_runs:
            purge = purge_at_scale(
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
    except (BenchError, ProcessStartError, dbos_peer.DbosUnavailable) as exc:
        raise BenchError(f"{exc}\nworker log ({worker.log_path}):\n{worker.log_tail()}") from None
    finally:
        worker.kill()
        threads.stop()
        queue.stop()
        _delete_bench_runs()
    worker.log_path.unlink(missing_ok=True)  # kept only when something went wrong
    return WorkerFigures(
        turns=turns,
        reads=reads,
        effects=effects,
        others=others,
        memory=memory,
        dbos_version=threads.version,
        child=child,
        purged=purge,
        cpu={name: meter.figure for name, meter in cpu.items()},
    )


def _conninfo() -> dict[str, Any]:
    """Where DBOS's system database goes: the bench's own server, as this process reaches it."""
    params = connection.get_connection_params()
    return {key: params.get(key) for key in ("dbname", "user", "password", "host", "port")}


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
        # The workers inherit it: under DEBUG Django logs the hand-written chain's ORM statements.
        "debug": settings.DEBUG,
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
