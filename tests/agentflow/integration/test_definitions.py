"""A definition that changes under a running run parks it for an operator, never guesses."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow._core import registry
from agentflow.models import RunEvent, WorkflowRun
from tests.support import workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

NAME = "crash_deploy"


def define(version: int, steps: list[str]) -> durable.Workflow:
    flow = durable.Workflow(NAME, version=version)
    for name in steps:
        flow.step(name, kind="read")(workflows.read)
    return flow


@pytest.fixture
def deployed() -> Iterator[list[durable.Workflow]]:
    """The definitions this test registers; all unregistered afterwards."""
    flows: list[durable.Workflow] = []
    yield flows
    for flow in flows:
        registry.unregister(flow)


def test_version_changed_under_a_running_run__parked_with_a_version_mismatch_event(
    deployed: list[durable.Workflow], drive: Callable[[str], WorkflowRun]
) -> None:
    v1 = define(1, ["a", "b"])
    deployed.append(v1)
    run_id = durable.start(NAME)
    # A deploy: v2 is registered and v1 is gone before the run's first step is handled.
    deployed.append(define(2, ["a", "b2"]))
    registry.unregister(v1)

    run = drive(run_id)

    assert run.status == RunStatus.NEEDS_ATTENTION
    assert run.wake_at is None
    assert f"{NAME} v1" in run.error and "this code has v2" in run.error
    event = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.VERSION_MISMATCH)
    assert event.detail == run.error
    assert not run.steps.exists()  # nothing of v1 was replayed by v2 code


def test_new_runs_after_a_deploy__use_the_latest_version(
    deployed: list[durable.Workflow], drive: Callable[[str], WorkflowRun]
) -> None:
    deployed.extend([define(1, ["a"]), define(2, ["a", "b"])])

    run = drive(durable.start(NAME))

    assert (run.version, run.status) == (2, RunStatus.COMPLETED)
    assert list(run.steps.order_by("seq").values_list("name", flat=True)) == ["a", "b"]


def test_step_removed_without_a_version_bump__parked_not_guessed(
    deployed: list[durable.Workflow], drive: Callable[[str], WorkflowRun]
) -> None:
    old = define(1, ["a", "b"])
    deployed.append(old)
    run_id = durable.start(NAME)
    registry.unregister(old)
    deployed.append(define(1, ["a2", "b"]))  # same version, first step renamed: a bad deploy

    run = drive(run_id)

    assert run.status == RunStatus.NEEDS_ATTENTION
    assert "step 'a' is not in crash_deploy v1" in run.error
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.VERSION_MISMATCH).exists()
