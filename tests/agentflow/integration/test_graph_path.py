"""The graph path never enters agent code (docs/layout.md): a graph run, carried from its start
to its end in this process, calls no function of `agentflow.agent`, which the core reaches only
through `registry.CodeDefined` and `runtime.CodeRuns`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from agentflow import agent, durable
from agentflow._base.states import RunStatus
from agentflow._engine import runtime
from agentflow.models import WorkflowRun
from tests.support import workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

AGENT_CODE = str(Path(agent.__file__).parent) + "/"


def test_a_graph_run__read_effect_read__calls_no_agent_code(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.chain.name)
    entered: set[str] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(AGENT_CODE):
            entered.add(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        run = drive(run_id)
    finally:
        sys.setprofile(None)

    assert run.status == RunStatus.COMPLETED, run.error
    assert not entered, sorted(entered)


def test_an_agent_run__is_carried_by_agent_code() -> None:
    """The check above can see agent code: an agent run's step enters it."""
    run_id = durable.start(workflows.agent.name)
    entered: set[str] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(AGENT_CODE):
            entered.add(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        runtime.run_step(run_id, 1)
    finally:
        sys.setprofile(None)

    assert "next_call" in entered
