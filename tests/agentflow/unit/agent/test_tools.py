"""The tool registry: declared effects, schemas from type hints, validation before any call."""

from __future__ import annotations

import datetime
from typing import Annotated, Any

import pytest
from pydantic import Field

from agentflow._base.states import StepKind
from agentflow._core.serialization import NotJSONError
from agentflow.agent.loop import CodeWorkflow
from agentflow.agent.tools import Toolbox, ToolContext, ToolOutcome, ToolRecord
from agentflow.exceptions import DefinitionError, PermanentStepError, ToolRefused

Reference = Annotated[str, Field(description="Six letters or digits.", pattern=r"^[A-Za-z0-9]{6}$")]


def context(
    tool: str = "t", *, position: int = 4, history: tuple[ToolRecord, ...] = ()
) -> ToolContext:
    return ToolContext(
        run_id="wf_abc",
        workflow="agent",
        position=position,
        tool=tool,
        attempt=1,
        idempotency_key=f"wf_abc_step_{position}",
        input={"refund_id": "rf_1"},
        history=history,
    )


@pytest.fixture
def box() -> Toolbox:
    toolbox = Toolbox("unit_agent")
    calls: list[tuple[str, dict[str, Any]]] = []

    @toolbox.tool("fetch_booking", read_only=True, description="Look a booking up.")
    def fetch_booking(ctx: ToolContext, booking_reference: Reference) -> dict[str, Any]:
        calls.append(("fetch_booking", {"booking_reference": booking_reference}))
        return {"reference": booking_reference, "seat": "12C"}

    @toolbox.tool("charge_customer", side_effect=True, description="Charge  the\n fee.")
    def charge_customer(
        ctx: ToolContext, refund_id: str, amount_cents: Annotated[int, Field(ge=0)]
    ) -> dict[str, Any]:
        calls.append(("charge_customer", {"key": ctx.idempotency_key, "amount": amount_cents}))
        if amount_cents == 7:
            raise ToolRefused("look the booking up first")
        if amount_cents == 13:
            raise PermanentStepError("Your card was declined.")
        return {"charged": True, "amount_cents": amount_cents}

    @toolbox.tool("issue_boarding_pass", side_effect=True, description="Issue a pass.")
    def issue(
        ctx: ToolContext,
        booking_reference: Reference,
        flight: str,
        date: datetime.date,
        seat: str = "any",
    ) -> dict[str, Any]:
        calls.append(("issue_boarding_pass", {"date": date, "seat": seat}))
        return {"date": date.isoformat(), "seat": seat}

    toolbox.calls = calls  # type: ignore[attr-defined]
    return toolbox


# --- registration -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("flags", "said"), [({}, "neither"), ({"read_only": True, "side_effect": True}, "both")]
)
def test_register__a_tool_must_say_read_only_or_side_effect(
    flags: dict[str, bool], said: str
) -> None:
    with pytest.raises(
        DefinitionError,
        match=rf"exactly one of read_only=True or side_effect=True \(it said {said}\)",
    ):
        Toolbox("unit").tool("cancel_seat", description="d", **flags)


def test_register__refuses_bad_names_duplicates_and_missing_descriptions() -> None:
    toolbox = Toolbox("unit")
    for name in ("", "has space", "x" * 65, "llm"):
        with pytest.raises(DefinitionError, match="invalid tool name"):
            toolbox.tool(name, read_only=True, description="d")
    with pytest.raises(DefinitionError, match="needs a description"):
        toolbox.tool("t", read_only=True, description="  ")
    toolbox.tool("t", read_only=True, description="d")(lambda ctx: None)
    with pytest.raises(DefinitionError, match="registered twice"):
        toolbox.tool("t", read_only=True, description="d")


def test_register__parameters_need_type_hints_and_names() -> None:
    toolbox = Toolbox("unit")

    def untyped(ctx: ToolContext, reference) -> None:  # type: ignore[no-untyped-def]
        return None

    def star(ctx: ToolContext, *references: str) -> None:
        return None

    def no_context() -> None:
        return None

    with pytest.raises(DefinitionError, match="'reference' has no type hint"):
        toolbox.tool("a", read_only=True, description="d")(untyped)
    with pytest.raises(DefinitionError, match="plain named parameter"):
        toolbox.tool("b", read_only=True, description="d")(star)
    with pytest.raises(DefinitionError, match="first parameter must take the ToolContext"):
        toolbox.tool("c", read_only=True, description="d")(no_context)


def test_register__a_type_with_no_schema_is_refused() -> None:
    class Opaque:
        pass

    def takes(ctx: ToolContext, thing: Opaque) -> None:
        return None

    with pytest.raises(DefinitionError, match="tool 'd'"):
        Toolbox("unit").tool("d", read_only=True, description="d")(takes)


def test_register__read_only_tools_reconcile_and_compensate_nothing() -> None:
    with pytest.raises(DefinitionError, match="nothing to reconcile or compensate"):
        Toolbox("unit").tool("r", read_only=True, description="d", compensate="x")


def test_validate__a_compensation_must_be_registered_as_one_not_as_a_tool(box: Toolbox) -> None:
    @box.tool("charge_again", side_effect=True, description="d", compensate="fetch_booking")
    def charge_again(ctx: ToolContext, booking_reference: str) -> None:
        return None

    with pytest.raises(
        DefinitionError, match="'fetch_booking' as its compensation, which is not a compensation"
    ):
        box.validate()


def test_validate__unknown_compensation_is_refused() -> None:
    toolbox = Toolbox("unit")

    @toolbox.tool("charge", side_effect=True, description="d", compensate="refund")
    def charge(ctx: ToolContext, refund_id: str) -> None:
        return None

    with pytest.raises(DefinitionError, match="'refund' as its compensation"):
        toolbox.validate()


def with_refund(box: Toolbox) -> Toolbox:
    @box.compensation("refund_fee")
    def refund_fee(ctx: ToolContext, refund_id: str) -> dict[str, Any]:
        return {"refunded": True, "key": ctx.idempotency_key}

    @box.tool("charge_twice", side_effect=True, description="d", compensate="refund_fee")
    def charge_twice(ctx: ToolContext, refund_id: str, amount_cents: int) -> dict[str, Any]:
        return {}

    box.validate()
    return box


def test_compensation_call__takes_the_arguments_it_needs(box: Toolbox) -> None:
    with_refund(box)
    assert box.compensation_call("charge_twice", {"refund_id": "rf_1", "amount_cents": 4500}) == (
        "refund_fee",
        {"refund_id": "rf_1"},
    )
    assert box.compensation_call("fetch_booking", {"booking_reference": "ABC123"}) is None
    undo = box.prepare_undo("refund_fee", {"refund_id": "rf_1"})
    assert undo.kind == StepKind.EFFECT
    assert undo.run(context("refund_fee")).result == {"refunded": True, "key": "wf_abc_step_4"}


def test_compensation__never_offered_to_the_model_and_refused_if_it_names_one(
    box: Toolbox,
) -> None:
    """A model that could call refund_fee could record "refunded" before any charge, or give
    the fee back and still take the boarding pass: only the engine runs a compensation."""
    with_refund(box)

    assert "refund_fee" not in box.names and "refund_fee" not in box
    assert "refund_fee" not in [t["function"]["name"] for t in box.openai_tools()]
    called = box.prepare("refund_fee", {"refund_id": "rf_1"})
    assert called.kind == StepKind.READ  # nothing to claim: it runs nothing
    outcome = called.run(context("refund_fee"))
    assert outcome.ok is False and outcome.result["error"] == "unknown_tool"
    assert "refund_fee" not in outcome.result["message"].split("Tools: ")[1]


def test_compensation__planned_only_for_a_call_that_ran(box: Toolbox) -> None:
    """Issue 19 8c: a refused call (invalid, over a limit, refused by its tool) made nothing."""
    workflow = CodeWorkflow("unit_agent", version=1, toolbox=with_refund(box))
    ran_ok = {"ok": True, "result": {"charged": True}}
    refused = {"ok": False, "result": {"error": "refused", "message": "m"}}

    assert workflow.compensation_for("charge_twice", 5, output=ran_ok) == "refund_fee@5"
    assert workflow.compensation_for("charge_twice", 5, output=ran_ok, branch=0) == (
        "refund_fee@b0.5"
    )
    assert workflow.compensation_for("charge_twice", 6, output=refused) is None
    assert workflow.compensation_for("charge_twice", 7, output=None) is None


def test_compensation__a_name_is_a_tool_or_a_compensation_never_both(box: Toolbox) -> None:
    with pytest.raises(DefinitionError, match="registered twice"):
        box.compensation("fetch_booking")


def test_validate__compensation_needing_more_arguments_is_refused(box: Toolbox) -> None:
    @box.compensation("undo")
    def undo(ctx: ToolContext, refund_id: str, reason: str) -> None:
        return None

    @box.tool("do", side_effect=True, description="d", compensate="undo")
    def do(ctx: ToolContext, refund_id: str) -> None:
        return None

    with pytest.raises(DefinitionError, match=r"needs \['reason'\]"):
        box.validate()


# --- how many times a run may make a call --------------------------------------------------------
def ran(position: int, name: str, *, ok: bool = True) -> ToolRecord:
    return ToolRecord(position=position, name=name, arguments={}, result={}, ok=ok)


def test_max_calls__a_side_effect_is_made_once_per_run_unless_it_says_more(box: Toolbox) -> None:
    issue = {"booking_reference": "ABC123", "flight": "SK1240", "date": "2027-03-16"}
    assert box["issue_boarding_pass"].max_calls == 1
    assert box["fetch_booking"].max_calls is None  # reads may repeat

    first = box.prepare("issue_boarding_pass", issue, history=[ran(3, "fetch_booking")])
    second = box.prepare("issue_boarding_pass", issue, history=[ran(5, "issue_boarding_pass")])

    assert first.kind == StepKind.EFFECT and first.refused is None
    assert second.kind == StepKind.READ  # refused: nothing claimed, nothing run
    outcome = second.run(context("issue_boarding_pass"))
    assert outcome == ToolOutcome(
        ok=False,
        result={
            "error": "limit_reached",
            "message": "issue_boarding_pass was not called: a run may make it once, and this "
            "one has (the last was call 5). Nothing was done.",
        },
    )
    assert box.calls == []  # type: ignore[attr-defined]
    again = box.prepare(
        "fetch_booking", {"booking_reference": "ABC123"}, history=[ran(3, "fetch_booking")]
    )
    assert again.refused is None


def test_max_calls__a_refused_earlier_call_did_nothing_so_does_not_count(box: Toolbox) -> None:
    charge = {"refund_id": "rf_1", "amount_cents": 4500}
    assert (
        box.prepare(
            "charge_customer", charge, history=[ran(7, "charge_customer", ok=False)]
        ).refused
        is None
    )


def test_max_calls__declared_per_tool_and_at_least_one() -> None:
    toolbox = Toolbox("unit")
    toolbox.tool("note", side_effect=True, description="d", max_calls=3)(lambda ctx: None)
    notes = [ran(n, "note") for n in (2, 3)]
    assert toolbox.prepare("note", {}, history=notes).refused is None
    assert toolbox.prepare("note", {}, history=[*notes, ran(4, "note")]).refused is not None
    with pytest.raises(DefinitionError, match="max_calls of at least 1"):
        toolbox.tool("never", side_effect=True, description="d", max_calls=0)


# --- schema ------------------------------------------------------------------------------------
def test_openai_tools__schemas_from_type_hints_in_registration_order(box: Toolbox) -> None:
    tools = box.openai_tools()

    assert [t["function"]["name"] for t in tools] == [
        "fetch_booking",
        "charge_customer",
        "issue_boarding_pass",
    ]
    assert tools[0] == {
        "type": "function",
        "function": {
            "name": "fetch_booking",
            "description": "Look a booking up.",
            "parameters": {
                "type": "object",
                "properties": {
                    "booking_reference": {
                        "type": "string",
                        "description": "Six letters or digits.",
                        "pattern": "^[A-Za-z0-9]{6}$",
                    }
                },
                "required": ["booking_reference"],
                "additionalProperties": False,
            },
        },
    }
    charge = tools[1]["function"]
    assert charge["description"] == "Charge the fee."  # whitespace folded
    assert charge["parameters"]["properties"]["amount_cents"] == {"type": "integer", "minimum": 0}
    issue = tools[2]["function"]["parameters"]
    assert issue["properties"]["date"] == {"type": "string", "format": "date"}
    assert issue["required"] == ["booking_reference", "flight", "date"]
    assert issue["properties"]["seat"]["default"] == "any"


def test_kinds__read_only_runs_as_read_side_effect_as_effect(box: Toolbox) -> None:
    assert box["fetch_booking"].step_kind == StepKind.READ
    assert box["charge_customer"].step_kind == StepKind.EFFECT


# --- calls -------------------------------------------------------------------------------------
def test_valid_call__runs_with_typed_values_and_the_key(box: Toolbox) -> None:
    prepared = box.prepare("charge_customer", {"refund_id": "rf_1", "amount_cents": 4500.0})

    assert prepared.kind == StepKind.EFFECT
    outcome = prepared.run(context("charge_customer", position=7))

    assert outcome == ToolOutcome(ok=True, result={"charged": True, "amount_cents": 4500})
    assert box.calls == [("charge_customer", {"key": "wf_abc_step_7", "amount": 4500})]  # type: ignore[attr-defined]


def test_valid_call__json_dates_become_dates_and_defaults_apply(box: Toolbox) -> None:
    outcome = box.prepare(
        "issue_boarding_pass",
        {"booking_reference": "ABC123", "flight": "SK1240", "date": "2027-03-16"},
    ).run(context())

    assert outcome.result == {"date": "2027-03-16", "seat": "any"}
    assert box.calls == [
        ("issue_boarding_pass", {"date": datetime.date(2027, 3, 16), "seat": "any"})
    ]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("arguments", "problems"),
    [
        (
            {"refund_id": "rf_1", "amount_cents": "4500"},
            [{"field": "amount_cents", "problem": "Input should be a valid integer"}],
        ),
        (
            {"refund_id": "rf_1", "amount_cents": 45.5},
            [{"field": "amount_cents", "problem": "Input should be a valid integer"}],
        ),
        (
            {"refund_id": "rf_1", "amount_cents": -1},
            [{"field": "amount_cents", "problem": "Input should be greater than or equal to 0"}],
        ),
        ({"amount_cents": 1}, [{"field": "refund_id", "problem": "Field required"}]),
        (
            {"refund_id": "rf_1", "amount_cents": 1, "currency": "eur"},
            [{"field": "currency", "problem": "Extra inputs are not permitted"}],
        ),
        (
            ["rf_1", 4500],
            [{"field": "", "problem": "arguments must be a JSON object, got an array"}],
        ),
        (
            "{refund_id: rf_1",
            [
                {
                    "field": "",
                    "problem": "arguments must be a JSON object, "
                    "got a string or text that is not JSON",
                }
            ],
        ),
    ],
)
def test_invalid_call__not_executed_and_the_error_is_the_result(
    box: Toolbox, arguments: Any, problems: list[dict[str, str]]
) -> None:
    prepared = box.prepare("charge_customer", arguments)

    assert prepared.kind == StepKind.READ  # nothing runs, so nothing needs a claim first
    outcome = prepared.run(context())

    assert outcome.ok is False
    assert outcome.result["error"] == "invalid_arguments"
    assert outcome.result["problems"] == problems
    assert outcome.result["message"].startswith("charge_customer was not called: ")
    assert box.calls == []  # type: ignore[attr-defined]


def test_invalid_date__named_in_the_error(box: Toolbox) -> None:
    outcome = box.prepare(
        "issue_boarding_pass",
        {"booking_reference": "ABC123", "flight": "SK1240", "date": "2027-02-31"},
    ).run(context())

    assert outcome.ok is False
    [problem] = outcome.result["problems"]
    assert (
        problem["field"] == "date" and "day value is outside expected range" in problem["problem"]
    )


def test_pattern__a_bad_reference_never_reaches_the_tool(box: Toolbox) -> None:
    outcome = box.prepare("fetch_booking", {"booking_reference": "ABC-12"}).run(context())
    assert outcome.ok is False and "should match pattern" in outcome.result["message"]
    assert box.calls == []  # type: ignore[attr-defined]


def test_unknown_tool__the_model_is_told_which_exist(box: Toolbox) -> None:
    outcome = box.prepare("refund_everything", {}).run(context())

    assert outcome == ToolOutcome(
        ok=False,
        result={
            "error": "unknown_tool",
            "message": "There is no tool named 'refund_everything'. Tools: fetch_booking, "
            "charge_customer, issue_boarding_pass.",
        },
    )


def test_tool_refusal__becomes_the_result(box: Toolbox) -> None:
    outcome = box.prepare("charge_customer", {"refund_id": "rf_1", "amount_cents": 7}).run(
        context()
    )
    assert outcome == ToolOutcome(
        ok=False,
        result={
            "error": "refused",
            "message": "charge_customer did not run: look the booking up first",
        },
    )


def test_step_errors__propagate_to_the_runtime(box: Toolbox) -> None:
    with pytest.raises(PermanentStepError, match="declined"):
        box.prepare("charge_customer", {"refund_id": "rf_1", "amount_cents": 13}).run(context())


def test_result_must_be_json() -> None:
    toolbox = Toolbox("unit")

    @toolbox.tool("bad", read_only=True, description="d")
    def bad(ctx: ToolContext) -> Any:
        return {"when": datetime.date(2027, 1, 1)}

    with pytest.raises(NotJSONError, match="the result of tool 'bad'"):
        toolbox.prepare("bad", {}).run(context())


def test_outcome_json_round_trip() -> None:
    outcome = ToolOutcome(ok=False, result={"error": "refused", "message": "m"})
    assert ToolOutcome.from_json(outcome.as_json()) == outcome


# --- the context -------------------------------------------------------------------------------
HISTORY = (
    ToolRecord(position=2, name="fetch_booking", arguments={}, result={"seat": "12C"}, ok=True),
    ToolRecord(position=3, name="charge_customer", arguments={}, result={"error": "x"}, ok=False),
    ToolRecord(position=5, name="fetch_booking", arguments={}, result={"seat": "14B"}, ok=True),
)


def test_context__output_of_is_the_latest_result_that_ran() -> None:
    ctx = context(history=HISTORY)

    assert ctx.output_of("fetch_booking") == {"seat": "14B"}
    assert ctx.results_of("fetch_booking") == [{"seat": "12C"}, {"seat": "14B"}]
    assert ctx.output_of("charge_customer") is None  # refused calls did nothing
    assert ctx.outputs == {"fetch_booking": {"seat": "14B"}}


def test_context__as_a_step_context_keeps_its_own_key() -> None:
    ctx = ToolContext(
        run_id="wf_abc",
        workflow="agent",
        position=6,
        tool="cancel_seat",
        attempt=2,
        idempotency_key="wf_abc_b2_step_6",
        input={"refund_id": "rf_1"},
        history=HISTORY,
    )

    step = ctx.step_context()

    assert (step.run_id, step.seq, step.step, step.attempt) == ("wf_abc", 6, "cancel_seat", 2)
    assert step.idempotency_key == "wf_abc_b2_step_6"  # a forked branch's key, not wf_abc_step_6
    assert step.input == {"refund_id": "rf_1"}
    assert step.output_of("fetch_booking") == {"seat": "14B"}
