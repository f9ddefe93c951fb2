"""Declaring waits (docs/workflows.md, "Timers, signals and approvals"): a bad declaration is
refused when it is made, with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest

from agentflow import durable
from agentflow._core.registry import unregister
from agentflow.agent import Toolbox, ToolContext
from agentflow.agent.waiting import Waited, rejected_result, signal_call, sleep_call
from agentflow.exceptions import DefinitionError


@pytest.fixture
def flow() -> Iterator[durable.Workflow]:
    workflow = durable.Workflow("unit_waits", version=1)
    yield workflow
    unregister(workflow)


def test_sleep__needs_exactly_one_of_seconds_or_until(flow: durable.Workflow) -> None:
    with pytest.raises(DefinitionError, match="exactly one of seconds= or until="):
        flow.sleep("nap")
    with pytest.raises(DefinitionError, match="exactly one of seconds= or until="):
        flow.sleep("nap", seconds=1, until=lambda ctx: datetime.now())
    with pytest.raises(DefinitionError, match="0 or more"):
        flow.sleep("nap", seconds=-1)
    with pytest.raises(DefinitionError, match="0 or more"):
        flow.sleep("nap", seconds="soon")  # type: ignore[arg-type]


def test_step__requires_approval_is_true_false_or_a_predicate(flow: durable.Workflow) -> None:
    with pytest.raises(DefinitionError, match="requires_approval"):
        flow.step("charge", kind="effect", requires_approval="always")  # type: ignore[arg-type]
    with pytest.raises(DefinitionError, match="approval_arguments"):
        flow.step("charge", kind="effect", requires_approval=True, approval_arguments={"a": 1})  # type: ignore[arg-type]


def test_wait_for__needs_a_signal_and_a_positive_timeout(flow: durable.Workflow) -> None:
    with pytest.raises(DefinitionError, match="a signal name is 1-200 characters"):
        flow.wait_for("reply", signal="")
    with pytest.raises(DefinitionError, match="timeout must be above 0"):
        flow.wait_for("reply", signal="reply", timeout=0)
    flow.wait_for("reply", signal="reply", timeout=5)
    with pytest.raises(DefinitionError, match="declared twice"):
        flow.wait_for("reply", signal="reply")


def test_agent_waits__bad_arguments_are_refused_with_the_reason() -> None:
    with pytest.raises(DefinitionError, match="aware datetime"):
        sleep_call(until=datetime(2030, 1, 1))
    with pytest.raises(DefinitionError, match="seconds of 0 or more"):
        sleep_call(seconds=-3)
    with pytest.raises(DefinitionError, match="needs a signal name"):
        signal_call("", None)
    with pytest.raises(DefinitionError, match="above 0"):
        signal_call("reply", 0)
    assert signal_call("reply", 30).name == "wait_for:reply"


def test_tool__requires_approval_is_true_false_or_a_predicate() -> None:
    toolbox = Toolbox("unit_waits_tools")
    with pytest.raises(DefinitionError, match="requires_approval"):
        toolbox.tool("pay", side_effect=True, description="Pay.", requires_approval="yes")  # type: ignore[arg-type]

    @toolbox.tool(
        "charge",
        side_effect=True,
        description="Charge.",
        requires_approval=lambda args: args["cents"] > 100,
    )
    def charge(ctx: ToolContext, cents: int) -> dict:
        return {}

    assert toolbox["charge"].needs_approval({"cents": 101})
    assert not toolbox["charge"].needs_approval({"cents": 100})


def test_outcomes__what_the_code_reads() -> None:
    assert Waited.from_json({"payload": {"a": 1}}) == Waited(payload={"a": 1})
    assert Waited.from_json({"timed_out": True}).timed_out
    assert rejected_result({"reason": "no", "timed_out": False, "reply": "Sorry."}) == {
        "ok": False,
        "result": {"rejected": True, "reason": "no", "timed_out": False, "reply": "Sorry."},
    }
