"""Recovery figures: SIGKILL a pool child, or a whole worker, while a step holds; time the
step from the kill to its COMPLETED checkpoint on the database clock."""

from __future__ import annotations

import os
import signal
import statistics
import time
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings

from agentflow import durable
from agentflow.benchmark import workload
from agentflow.benchmark.throughput import BenchError, bench_worker, wait_until
from agentflow.models import StepCheckpoint
from agentflow.states import StepStatus
from agentflow.workers import WorkerProcess


@dataclass(frozen=True, kw_only=True)
class Recovery:
    samples: list[float]

    def as_dict(self) -> dict[str, float | int]:
        return {
            "samples": len(self.samples),
            "p50_s": round(statistics.median(self.samples), 3),
            "max_s": round(max(self.samples), 3),
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
        wait_until(lambda: len(worker.children()) >= worker.concurrency or None, timeout=30,
                   what=lambda: "the pool to replace its child")  # fmt: skip
    return Recovery(samples=seconds)


def worker_kill_recovery(*, samples: int, concurrency: int) -> Recovery:
    """Kill the whole worker (parent and children), start a fresh one with beat: its message
    stays unacked in Redis until the visibility timeout, so the sweeper must find the run once
    the lease expires. Bound: lease + sweep interval."""
    seconds = []
    for _ in range(samples):
        doomed = bench_worker(concurrency, beat=True).start(timeout=60)
        try:
            run_id = durable.start(workload.HOLD)
            _holding_pid(run_id)
            killed_at = time.time()
        finally:
            doomed.kill()
        workload.redis_client().set(workload.release_key(run_id), 1)
        fresh = bench_worker(concurrency, beat=True)
        try:
            fresh.start(timeout=60)
            seconds.append(_completed_at(run_id).timestamp() - killed_at)
        finally:
            fresh.kill()
    return Recovery(samples=seconds)


def bound_seconds() -> int:
    return settings.AGENTFLOW_LEASE_SECONDS + settings.AGENTFLOW_SWEEP_INTERVAL


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
    return int(owner.split("/")[1])


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
