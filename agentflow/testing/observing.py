"""Waiting on runs that real worker processes drive."""

from __future__ import annotations

from typing import Any

from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES
from agentflow.testing.waiting import wait_for

__all__ = ["wait_for_run"]


def wait_for_run(run_id: str, *, timeout: float = 30.0, worker: Any = None) -> durable.RunSnapshot:
    """The run's snapshot once it stops moving: finished (COMPLETED, FAILED, CANCELLED) or
    parked (NEEDS_ATTENTION). Polls the database with a deadline and fails after `timeout`
    seconds; with `worker` (an `agentflow_worker`), fails at once, with its log, if that
    worker died."""

    def stopped() -> durable.RunSnapshot | None:
        if worker is not None:
            assert worker.alive(), f"the worker died:\n{worker.log_tail()}"
        run = durable.snapshot(run_id)
        return run if run is not None and run.status not in ACTIVE_RUN_STATUSES else None

    try:
        found = wait_for(stopped, timeout=timeout, interval=0.05, what=f"run {run_id} to stop")
    except AssertionError as late:
        run = durable.snapshot(run_id)
        seen = f"; last seen {run.status} at {run.current_step!r}" if run is not None else ""
        # The worker's log as it is now, when it says what the run waited for.
        tail = f"\n{worker.log_tail()}" if worker is not None else ""
        raise AssertionError(f"{late}{seen}{tail}") from None
    assert found is not None
    return found
