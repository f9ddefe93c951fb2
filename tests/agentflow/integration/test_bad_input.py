"""Bad input is refused before anything is written; bad step output fails the run cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.conf import settings
from django.db import connections

from agentflow import durable
from agentflow._base.states import RunStatus, StepStatus
from agentflow.models import StepCheckpoint, WorkflowRun
from tests.support import partner, workflows
from tests.support.processes import RedisServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def nothing_written(engine: RedisServer) -> bool:
    return not WorkflowRun.objects.exists() and engine.queue_length() == 0


def test_start__unknown_workflow__refused(engine: RedisServer) -> None:
    with pytest.raises(durable.UnknownWorkflowError, match="no workflow named 'no_such_flow'"):
        durable.start("no_such_flow")
    assert nothing_written(engine)


def test_start_workflow_command__unknown_workflow__clear_error_and_nonzero_exit() -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "start_workflow", "no_such_flow"],
        cwd=settings.BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "no workflow named 'no_such_flow'" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize(
    "bad_input",
    [{"tags": {"a", "b"}}, {"when": object()}, {"amount": float("nan")}, {1: {2: b"bytes"}}],
    ids=["set", "object", "nan", "bytes"],
)
def test_start__input_not_json__refused_and_nothing_written(
    bad_input: object, engine: RedisServer
) -> None:
    with pytest.raises(durable.InvalidInputError, match="workflow input is not JSON"):
        durable.start(workflows.chain.name, input=bad_input)
    assert nothing_written(engine)


def test_step_output_not_json__run_failed_naming_the_step_nothing_half_written(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.bad_output.name)

    run = drive(run_id)

    assert run.status == RunStatus.FAILED
    assert run.error.startswith("summarise: output of step summarise is not JSON")
    assert run.output is None and run.wake_at is None
    assert run.current_seq == 2  # it never advanced past the bad step
    steps = list(StepCheckpoint.objects.filter(run_id=run_id).order_by("seq"))
    assert [(cp.name, cp.status) for cp in steps] == [
        ("prepare", StepStatus.COMPLETED),
        ("summarise", StepStatus.FAILED),
    ]
    assert steps[1].output is None


def test_effect_output_not_json__run_parked_for_an_operator_effect_made_once(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """Failing would skip the compensation of an effect that happened; parking does not."""
    run_id = durable.start(workflows.bad_effect_output.name)

    run = drive(run_id)

    assert run.status == RunStatus.NEEDS_ATTENTION
    assert run.error.startswith("charge ran but its result cannot be recorded")
    assert partner.effects() == {durable.idempotency_key(run_id, 1): 1}
    assert run.events.filter(kind="needs_attention").count() == 1


def test_start__same_business_key__same_run() -> None:
    first = durable.start(workflows.chain.name, business_key="order-1")

    assert durable.start(workflows.chain.name, business_key="order-1") == first
    assert durable.start(workflows.chain.name, business_key="order-2") != first
    assert WorkflowRun.objects.count() == 2


def test_start__same_business_key_from_two_threads_at_once__one_run() -> None:
    barrier = threading.Barrier(2)

    def start() -> str:
        try:
            barrier.wait(timeout=10)
            return durable.start(workflows.chain.name, business_key="order-race")
        finally:
            connections.close_all()

    with ThreadPoolExecutor(2) as pool:
        ids = list(pool.map(lambda _: start(), range(2)))

    assert ids[0] == ids[1]
    assert WorkflowRun.objects.count() == 1
