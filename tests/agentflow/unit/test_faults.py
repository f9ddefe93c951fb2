"""AGENTFLOW_CRASH_AT values that can never fire are reported, not silently ignored."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import agentflow
from agentflow._core import faults

ENGINE = Path(agentflow.__file__).parent


@pytest.mark.parametrize(
    "value", ["", "charge_customer:after_effect", "cancel_seat:after_claim", "a:b:after_complete"]
)
def test_crash_at__a_step_and_a_known_point__can_fire(value: str) -> None:
    assert faults.crash_at_problem(value) is None


@pytest.mark.parametrize(
    "value", ["issue_boarding_pass:before_effect", "charge_customer", ":after_effect", "x:"]
)
def test_crash_at__an_unknown_point_or_no_step__says_why(value: str) -> None:
    problem = faults.crash_at_problem(value)

    assert problem is not None and "after_claim, after_effect, after_complete" in problem


def test_every_point_the_engine_crashes_at_is_a_known_one() -> None:
    used = {
        point
        for path in ENGINE.rglob("*.py")
        for point in re.findall(r"crash_point\([^)]*?\"(\w+)\"", path.read_text())
    }

    assert used == {*faults.CRASH_POINTS, *faults.SCHEDULE_CRASH_POINTS}
