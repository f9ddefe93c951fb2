"""Recovery figures: SIGKILL a pool child, or a whole worker, while a step holds; time the
step from the kill to its recovery on the database clock."""

from __future__ import annotations

import os
import signal
import statistics
import time
from dataclasses import dataclass
from datetime import datetime

from agentflow import durable
from agentflow._base.states import StepStatus
from agentflow.models import RunEvent, StepCheckpoint
from agentflow.testing.processes import WorkerProcess
from config.bench import workload
from config.bench.throughput import BenchError, bench_worker, wait_until


@dataclass(frozen=True, kw_only=True)
class Recovery:
    samples: list[float]

    def as_dict(self) -> dict[str, float | int]:
        ordered = sorted(self.samples)
        return {
            "samples": len(ordered),
            "p50_s": round(statistics.median(ordered), 3),
            # Nearest rank: with 10 samples the p99 is the largest, as it should be.
            "p99_s": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
            "max_s": round(ordered[-1], 3),
        }


def child_kill_recovery(worker: WorkerProcess, *, samples: int) -> Recovery:
    """Kill the pool process running the held step; Celery redelivers its message at once
    (reject on worker lost) and the dead owner's lease is taken over without waiting."""
    seconds = []
    for _ in range(samples):
        run_id = durable.start(workload.HOLD)
        owner_pid = _holding_pid(run_id)
        killed_at = time.time()
        os.kill(owner_pid, signal.SIGKILL)
        workload.redis_client().set(workload.release_key(run_id), 1)
        seconds.append(_completed_at(run_id).timestamp() - killed_at)
        wait_until(
            lambda: len(worker.children()) >= worker.concurrency or None,
            timeout=30,
            what=lambda: "the pool to replace its child",
        )
    return Recovery(samples=seconds)


def worker_kill_recovery(*, samples: int) -> Recovery:
    """Kill a whole worker (parent and children) mid-step while another worker runs with beat:
    the dead worker's sessions end, its advisory lock is freed, and the survivor's sweeper
    re-publishes the run at its next pass, without waiting for the lease
    (docs/protocol.md, "Liveness"). Timed from the kill to the survivor's takeover (its claim of
    attempt 2, database clock).

    The held run is started until one lands on the worker about to die; runs that land on the
    survivor are released and finish normally."""
    seconds = []
    survivor = bench_worker(1, beat=True).start(timeout=60)
    try:
        for _ in range(samples):
            doomed = bench_worker(1).start(timeout=60)
            try:
                run_id = _held_by(doomed, survivor)
                killed_at = time.time()
            finally:
                doomed.kill()
            seconds.append(_taken_over_at(run_id).timestamp() - killed_at)
            workload.redis_client().set(workload.release_key(run_id), 1)
            _completed_at(run_id)
    finally:
        survivor.kill()
    return Recovery(samples=seconds)


def _held_by(doomed: WorkerProcess, survivor: WorkerProcess) -> str:
    """A held run whose step runs in `doomed`. Two held runs, one after the other: each worker
    runs one process and takes one message at a time (prefetch 1, late acks), so the second
    run goes to whichever worker the first did not. The one on `survivor` is released."""
    first = durable.start(workload.HOLD)
    first_owner = _holding_pid(first)
    second = durable.start(workload.HOLD)
    second_owner = _holding_pid(second)
    by_owner = {first_owner: first, second_owner: second}
    target = next((run for pid, run in by_owner.items() if pid in doomed.children()), None)
    for run in by_owner.values():
        if run != target:
            workload.redis_client().set(workload.release_key(run), 1)
    if target is None or not any(pid in survivor.children() for pid in by_owner):
        raise BenchError("the two held runs did not land one on each worker")
    return target


def bound_seconds() -> float:
    """Recovery target after a whole worker dies (docs/protocol.md, "Liveness")."""
    return 2.0


def _taken_over_at(run_id: str) -> datetime:
    found = wait_until(
        lambda: (
            RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.TAKEOVER)
            .values_list("at", flat=True)
            .first()
        ),
        timeout=120,
        what=lambda: f"run {run_id} to be taken over",
    )
    return found


def _holding_pid(run_id: str) -> int:
    """The pid in the lease of the held step, once it is claimed."""
    owner = wait_until(
        lambda: (
            StepCheckpoint.objects.filter(run_id=run_id, seq=1, status=StepStatus.IN_PROGRESS)
            .values_list("lease_owner", flat=True)
            .first()
        ),
        timeout=30,
        what=lambda: f"run {run_id} to claim its held step",
    )
    return int(owner.split("/")[1])  # host/pid/nonce


def _completed_at(run_id: str) -> datetime:
    finished = wait_until(
        lambda: (
            StepCheckpoint.objects.filter(run_id=run_id, seq=1, status=StepStatus.COMPLETED)
            .values_list("finished_at", flat=True)
            .first()
        ),
        timeout=120,
        what=lambda: f"run {run_id} to recover its held step",
    )
    if finished is None:  # pragma: no cover - wait_until returns a value
        raise BenchError("no finish time")
    return finished
