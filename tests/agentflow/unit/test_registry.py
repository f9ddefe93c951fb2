"""Workflow definitions: step order, branching, compensations and registration rules."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentflow._core import registry
from agentflow._core.registry import END, Workflow
from agentflow.exceptions import DefinitionError, UnknownWorkflowError


def noop(ctx: Any) -> None:
    return None


@pytest.fixture
def define() -> Iterator[Any]:
    """`define(name, version=1, ...)`: a registered workflow, unregistered after the test."""
    made: list[Workflow] = []

    def make(name: str, **options: Any) -> Workflow:
        flow = Workflow(f"unit_{name}", **options)
        made.append(flow)
        return flow

    yield make
    for flow in made:
        registry.unregister(flow)


def test_navigation__forward_steps_in_declared_order(define: Any) -> None:
    flow = define("line")
    for name in ("a", "b", "c"):
        flow.step(name)(noop)

    assert flow.first_step() == "a"
    assert [flow.next_step("a", None), flow.next_step("b", None), flow.next_step("c", None)] == [
        "b",
        "c",
        None,
    ]


def test_navigation__compensation_steps_are_not_on_the_forward_path(define: Any) -> None:
    flow = define("undo", on_failure="tell")
    flow.step("charge", kind="effect", compensate="refund")(noop)
    flow.compensation("refund")(noop)
    flow.step("ship", kind="effect")(noop)
    flow.compensation("tell")(noop)
    flow.validate()

    assert flow.forward_steps == ["charge", "ship"]
    assert flow.next_step("charge", None) == "ship"
    assert flow.next_step("ship", None) is None


def test_branching__output_chooses_the_next_step_or_the_end(define: Any) -> None:
    flow = define("branch")
    flow.step("check", next=lambda out: "approve" if out["ok"] else END)(noop)
    flow.step("reject")(noop)
    flow.step("approve")(noop)

    assert flow.next_step("check", {"ok": True}) == "approve"
    assert flow.next_step("check", {"ok": False}) is None
    assert flow.next_step("reject", None) == "approve"  # without `next`, declared order


@pytest.mark.parametrize("target", ["nowhere", "refund"])
def test_branching__to_an_unknown_or_compensation_step__refused(define: Any, target: str) -> None:
    flow = define(f"bad_branch_{target}")
    flow.step("check", kind="effect", next=lambda out: target, compensate="refund")(noop)
    flow.compensation("refund")(noop)

    with pytest.raises(DefinitionError, match=f"chose '{target}'"):
        flow.next_step("check", None)


def test_duplicate_step_name__refused(define: Any) -> None:
    flow = define("dupe_step")
    flow.step("a")(noop)
    with pytest.raises(DefinitionError, match="declared twice"):
        flow.step("a")(noop)
    with pytest.raises(DefinitionError, match="declared twice"):
        flow.compensation("a")(noop)


@pytest.mark.parametrize("name", ["", END])
def test_invalid_step_name__refused(define: Any, name: str) -> None:
    with pytest.raises(DefinitionError, match="invalid step name"):
        define(f"invalid_{len(name)}").step(name)


@pytest.mark.parametrize("name", ["undo@7", "undo@b0.7", "a\x00b", " padded", "x" * 101])
def test_step_name__the_engines_undo_form_a_control_character_or_too_long__refused(
    define: Any, name: str
) -> None:
    with pytest.raises(DefinitionError, match="invalid step name"):
        define(f"invalid_{abs(hash(name))}").step(name)


def test_names__slashes_colons_dots_spaces_and_any_script__accepted(define: Any) -> None:
    """Names as real systems write them: a workflow, its steps, the signal it waits for."""
    flow = define("billing/eu:refunds ü 東京")
    flow.step("charge card/eu: ü")(noop)
    flow.wait_for("await the bank: 東京", signal="bank/ü: settled.v2")
    flow.compensation("refund card/eu.v2")(noop)

    assert flow.forward_steps == ["charge card/eu: ü", "await the bank: 東京"]


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (lambda: Workflow("unit_odd\nname"), "workflow name is 1-100 characters"),
        (lambda: Workflow("unit_" + "w" * 100), "has 105"),
        (lambda: Workflow("unit_bad_sensitive", sensitive_input="refund_id"), "sensitive_input"),
        (
            lambda: Workflow("unit_odd_signal").wait_for("w", signal="bank\tanswer"),
            "signal name is 1-200 characters.*U\\+0009",
        ),
        (lambda: Workflow("unit_odd_compensation").compensation("u" * 89), "1-88 characters"),
    ],
)
def test_names__refused_at_definition_with_what_is_wrong(make: Any, says: str) -> None:
    with pytest.raises(DefinitionError, match=says):
        make()


def test_duplicate_workflow_version__refused(define: Any) -> None:
    define("twice", version=1)
    with pytest.raises(DefinitionError, match="registered twice"):
        Workflow("unit_twice", version=1)


def test_versions__latest_wins_and_unregister_falls_back(define: Any) -> None:
    v1 = define("versions", version=1)
    v3 = define("versions", version=3)
    v2 = define("versions", version=2)

    assert registry.latest("unit_versions") is v3
    assert registry.lookup("unit_versions", 2) is v2
    registry.unregister(v3)
    assert registry.latest("unit_versions") is v2
    assert registry.lookup("unit_versions", 3) is None
    registry.unregister(v2)
    registry.unregister(v1)
    with pytest.raises(UnknownWorkflowError, match="no workflow named 'unit_versions'"):
        registry.latest("unit_versions")


def test_validate__unknown_compensation_or_on_failure__refused(define: Any) -> None:
    flow = define("dangling")
    flow.step("charge", kind="effect", compensate="refund")(noop)
    with pytest.raises(DefinitionError, match="unknown compensation 'refund'"):
        flow.validate()

    other = define("dangling_failure", on_failure="tell")
    other.step("a")(noop)
    with pytest.raises(DefinitionError, match="on_failure 'tell' is not a compensation step"):
        other.validate()


def test_first_step__empty_workflow__refused(define: Any) -> None:
    with pytest.raises(DefinitionError, match="has no steps"):
        define("empty").first_step()
