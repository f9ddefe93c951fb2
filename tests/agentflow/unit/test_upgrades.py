"""The rule that decides whether new code can take a run
(docs/deploys.md, "What happens to a run at its next step"), without a database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentflow import durable
from agentflow._base.states import StepStatus
from agentflow._builds import upgrades
from agentflow._core import registry

NAME = "upgrade_rule"


@pytest.fixture
def defined() -> Iterator[list[durable.Workflow]]:
    flows: list[durable.Workflow] = []
    yield flows
    for flow in flows:
        registry.unregister(flow)


def define(
    defined: list[durable.Workflow], version: int, steps: list[tuple[str, str]]
) -> durable.Workflow:
    flow = durable.Workflow(NAME, version=version, on_failure="notify")
    for name, kind in steps:
        flow.step(name, kind=kind, compensate="refund" if name == "charge" else None)(
            lambda ctx: {}
        )
    flow.compensation("refund")(lambda ctx: {})
    flow.compensation("notify")(lambda ctx: {})
    defined.append(flow)
    return flow


def facts(recorded: list[tuple[str, str]], at: str, **extra: object) -> upgrades.RunFacts:
    steps = [
        upgrades.Recorded(
            seq=seq,
            name=name,
            kind=kind,
            status=StepStatus.COMPLETED,
            retryable=False,
            idempotency_key=f"wf_x_step_{seq}",
            output={"amount_cents": 4500},
        )
        for seq, (name, kind) in enumerate(recorded, start=1)
    ]
    return upgrades.RunFacts(
        id="wf_x",
        workflow=NAME,
        version=1,
        build="old",
        input={},
        current_step=at,
        current_seq=len(recorded) + 1,
        branch=0,
        compensations=[],
        waiting=False,
        recorded=steps,
        **extra,  # type: ignore[arg-type]
    )


def test_added_step_after_its_position__safe(defined: list[durable.Workflow]) -> None:
    new = define(
        defined, 2, [("load", "read"), ("charge", "effect"), ("check", "read"), ("end", "read")]
    )
    assert upgrades.check(new, facts([("load", "read"), ("charge", "effect")], "end")).safe


def test_renamed_step_it_passed__differs_with_the_effects_past_it(
    defined: list[durable.Workflow],
) -> None:
    new = define(defined, 2, [("load_v2", "read"), ("charge", "effect"), ("end", "read")])
    check = upgrades.check(new, facts([("load", "read"), ("charge", "effect")], "end"))
    assert not check.safe and check.position == 1 and "'load'" in check.reason
    assert check.diff() == "- 1 load (read)\n+ 1 (no step 'load')"
    assert [(e["step"], e["amount_cents"]) for e in check.effects] == [("charge", 4500)]


def test_kind_changed__differs(defined: list[durable.Workflow]) -> None:
    new = define(defined, 2, [("load", "effect"), ("end", "read")])
    assert not upgrades.check(new, facts([("load", "read")], "end")).safe


def test_reordered__differs(defined: list[durable.Workflow]) -> None:
    new = define(defined, 2, [("b", "read"), ("a", "read"), ("end", "read")])
    check = upgrades.check(new, facts([("a", "read"), ("b", "read")], "end"))
    assert not check.safe and "order" in check.reason


def test_the_step_it_is_at_removed__differs(defined: list[durable.Workflow]) -> None:
    new = define(defined, 2, [("load", "read"), ("end", "read")])
    check = upgrades.check(new, facts([("load", "read")], "gone"))
    assert not check.safe and "'gone'" in check.reason


def test_compensation_it_may_need_now_another__differs(defined: list[durable.Workflow]) -> None:
    new = define(defined, 2, [("charge", "effect"), ("end", "read")])
    old = {"steps": [{"name": "charge", "compensate": "refund_v1", "compensation_only": False}]}
    check = upgrades.check(new, facts([("charge", "effect")], "end", old_shape=old))
    assert not check.safe and "refund_v1" in check.reason


def test_no_such_workflow_in_this_build__differs() -> None:
    assert not upgrades.check(None, facts([], "a")).safe
