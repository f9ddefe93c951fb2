"""Fixtures for tests that play the worker in this process: real Postgres, a private Redis.

Nothing is autouse: engine tests opt in with `pytest.mark.usefixtures("engine")`; `drive`
runs a run's steps here until it stops moving.
"""

from __future__ import annotations

import json
from base64 import b64decode
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow._engine import runtime
from agentflow.models import WorkflowRun
from agentflow.testing.inprocess import next_batch_member
from agentflow.testing.waiting import wait_for
from tests.support.processes import RedisServer

Drive = Callable[[str], WorkflowRun]


def step_messages(broker: RedisServer) -> list[tuple[list[Any], dict[str, Any]]]:
    """(args, kwargs) of every step message waiting in the broker, oldest first."""
    bodies = [json.loads(b64decode(json.loads(raw)["body"])) for raw in broker.queued_messages()]
    return [(args, kwargs) for args, kwargs, _ in reversed(bodies)]


@pytest.fixture
def engine(broker: RedisServer, partner_db: Path) -> RedisServer:
    """Every test publishes to the private broker and records executions at a fresh partner."""
    return broker


@pytest.fixture
def drive() -> Drive:
    """Play the worker in this process: run the current step until the run stops moving.

    It stops at WAITING too: a worker would wait for the back-off message's ETA.
    """

    def run_until_stopped(run_id: str, *, max_steps: int = 50) -> WorkflowRun:
        for _ in range(max_steps):
            run = WorkflowRun.objects.get(pk=run_id)
            if run.status not in ACTIVE_RUN_STATUSES:
                return run
            before = (run.status, run.current_seq, run.current_step)
            # Read-only calls running at once: play the worker of each one not yet recorded.
            member = next_batch_member(run_id)
            if member is None:
                runtime.run_step(run_id, run.current_seq)
            while member is not None:
                runtime.run_step(run_id, member)
                now = next_batch_member(run_id)
                member = now if now != member else None
            after = WorkflowRun.objects.get(pk=run_id)
            if (
                after.status == RunStatus.WAITING
                or (after.status, after.current_seq, after.current_step) == before
            ):
                return after
        raise AssertionError(f"{run_id} still moving after {max_steps} steps")

    return run_until_stopped


def stopped(run_id: str, *, timeout: float, worker: Any = None) -> durable.RunSnapshot:
    """The run once it stops moving: finished, or parked for an operator. With `worker`, fail
    at once (with its log) if that worker died."""

    def done() -> durable.RunSnapshot | None:
        if worker is not None:
            assert worker.alive(), worker.log_tail()
        run = durable.snapshot(run_id)
        return run if run is not None and run.status not in ACTIVE_RUN_STATUSES else None

    return wait_for(done, timeout=timeout, interval=0.05, what=f"run {run_id} to stop")
