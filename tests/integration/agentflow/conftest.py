"""Fixtures for engine integration tests: real Postgres, a private Redis, steps run here.

Nothing is autouse (other modules share this folder): engine tests opt in with
`pytest.mark.usefixtures("engine")`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from agentflow import runtime
from agentflow.models import WorkflowRun
from agentflow.states import ACTIVE_RUN_STATUSES, RunStatus
from tests.support.processes import RedisServer

Drive = Callable[[str], WorkflowRun]


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
            runtime.run_step(run_id, run.current_seq)
            after = WorkflowRun.objects.get(pk=run_id)
            if (
                after.status == RunStatus.WAITING
                or (after.status, after.current_seq, after.current_step) == before
            ):
                return after
        raise AssertionError(f"{run_id} still moving after {max_steps} steps")

    return run_until_stopped
