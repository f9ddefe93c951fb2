"""The refund agent's tools against the partner sandbox, and its planner driving them.

The conversation is driven by hand here: each model turn and each tool call takes the next
position, and every tool gets the run's earlier calls as history, as the durable replay loop
will give them (the loop itself, with checkpoints and crashes, is tested where it is built).
Effects are counted in the sandbox's ledger, the partners' side of the story.
"""

from __future__ import annotations

import secrets
from dataclasses import replace
from typing import Any

import pytest

from agentflow.agent import (
    ModelClient,
    ModelRequest,
    ModelResponse,
    ToolContext,
    ToolOutcome,
    ToolRecord,
    tool_result_message,
)
from agentflow.agent.openai_chat import OpenAIChatModel
from agentflow.durable import PermanentStepError, StepStatus, UndoneCall
from agentflow.exceptions import OutcomeUnknown
from refunds.agent import prompts
from refunds.agent.guardrails import GuardrailViolation
from refunds.agent.planner import MODEL, plan_refund, scripted_refund_model
from refunds.agent.tools import toolbox
from refunds.models import RefundRequest
from refunds.sandbox.airline import owner_of
from tests.support.airline_days import new_flight
from tests.support.llm_server import Answer, LLMServer, SeenRequest, reply, tool_calls

pytestmark = pytest.mark.django_db


class AgentRun:
    """One refund agent run, its positions and history kept in memory."""

    def __init__(self, reference: str = "ABC123", words: str | None = None) -> None:
        self.run_id = f"wf_{secrets.token_hex(16)}"
        self.owner = owner_of(reference)
        self.new = new_flight()  # what the customer asks for unless `words` say otherwise
        words = self.new.words() if words is None else words
        self.request = RefundRequest.objects.create(
            email=self.owner.email,
            last_name=self.owner.last_name,
            booking_reference=reference,
            message=words,
            submission_token=secrets.token_hex(16),
            workflow_id=self.run_id,
        )
        self.refund_id = self.request.public_id
        self.position = 0
        self.history: list[ToolRecord] = []
        self.messages = list(prompts.opening_messages(self.refund_id, words))
        self.positions: dict[str, list[int]] = {}

    def key(self, tool: str, index: int = 0) -> str:
        return f"{self.run_id}_step_{self.positions[tool][index]}"

    def ctx(self, tool: str, position: int, *, attempt: int = 1) -> ToolContext:
        return ToolContext(
            run_id=self.run_id,
            workflow="refund_agent",
            position=position,
            tool=tool,
            attempt=attempt,
            idempotency_key=f"{self.run_id}_step_{position}",
            input={"refund_id": self.refund_id},
            history=tuple(r for r in self.history if r.position < position),
        )

    def call(self, name: str, **arguments: Any) -> ToolOutcome:
        """The model asks for `name`: it runs at the next position."""
        self.position += 1
        self.positions.setdefault(name, []).append(self.position)
        prepared = toolbox.prepare(name, arguments, history=self.history)
        outcome = prepared.run(self.ctx(name, self.position))
        self.history.append(
            ToolRecord(
                position=self.position,
                name=name,
                arguments=arguments,
                result=outcome.result,
                ok=outcome.ok,
            )
        )
        return outcome

    def undo(self, name: str, **arguments: Any) -> ToolOutcome:
        """The engine runs compensation `name` at the next position (the run failed), handed
        the latest completed call it undoes, as the engine hands it over."""
        undone = next(
            r
            for r in reversed(self.history)
            if r.ok and r.name in toolbox and toolbox[r.name].compensate == name
        )
        self.position += 1
        self.positions.setdefault(name, []).append(self.position)
        ctx = replace(
            self.ctx(name, self.position),
            undoes=UndoneCall(
                name=undone.name,
                seq=undone.position,
                branch=0,
                status=StepStatus.COMPLETED,
                arguments=undone.arguments,
                output=undone.result,
                idempotency_key=self.key(undone.name),
            ),
        )
        return toolbox.prepare_undo(name, arguments).run(ctx)

    def retry(self, name: str, **arguments: Any) -> ToolOutcome:
        """The same call again at its own position and key (a retry after a crash)."""
        position = self.positions[name][-1]
        return toolbox.prepare(name, arguments).run(self.ctx(name, position, attempt=2))

    def converse(self, model: ModelClient) -> ModelResponse:
        tools = tuple(toolbox.openai_tools())
        for _turn in range(10):
            self.position += 1
            request = ModelRequest(model=model.model, messages=tuple(self.messages), tools=tools)
            response = model.complete(request)
            self.messages.append(response.message)
            if response.is_final:
                return response
            for tool_call in response.tool_calls:
                outcome = self.call(tool_call.name, **tool_call.arguments)
                self.messages.append(tool_result_message(tool_call.id, outcome.result))
        raise AssertionError("the agent did not finish in 10 turns")

    def through_charge(self, fee: int = 4500) -> None:
        self.call("load_request", refund_id=self.refund_id)
        self.call("fetch_booking", booking_reference=self.request.booking_reference)
        self.call("check_cancellation_policy", booking_reference=self.request.booking_reference)
        assert self.call("charge_customer", refund_id=self.refund_id, amount_cents=fee).ok
        self.call("cancel_seat", booking_reference=self.request.booking_reference)


def test_scripted_agent__rebooks_charges_45_dollars_and_confirms(partners) -> None:
    run = AgentRun()

    final = run.converse(scripted_refund_model)

    assert final.text.startswith(f"You're booked on SK1240 on {run.new.date}, seat ")
    assert "$45.00" in final.text
    ledger = partners.ledger(workflow_id=run.run_id)
    # The model's charge only holds the fee; the run takes it in code after the answer.
    assert [a["idempotency_key"] for a in ledger["authorizations"]] == [run.key("charge_customer")]
    assert ledger["authorizations"][0]["amount"] == 4500
    assert ledger["authorizations"][0]["metadata"]["refund_id"] == run.refund_id
    assert ledger["payments"] == []
    assert [c["idempotency_key"] for c in ledger["seat_cancellations"]] == [run.key("cancel_seat")]
    [issued] = ledger["boarding_passes"]
    assert (issued["flight"], issued["date"]) == ("SK1240", run.new.date)
    [crm] = ledger["crm_updates"]
    assert (
        crm["note"].startswith(f"Rebooked onto SK1240 on {run.new.date}")
        and "Fee: $45.00" in crm["note"]
    )
    [email] = ledger["emails"]
    assert email["message_id"] == f"<{run.key('send_confirmation_email')}@agentflow.refunds>"
    assert email["subject"] == f"Your flight change is confirmed: SK1240 on {run.new.in_words}"
    assert email["to"] == [run.owner.email]  # the booking's contact on file
    # the positions are the model's order: turn, call, turn, call, call, ...
    assert [run.positions[name][0] for name in toolbox.names if name in run.positions] == [
        2,
        4,
        5,
        8,
        7,
        10,
        12,
        13,
    ]


def test_openai_sdk_agent__same_refund_through_the_local_model_server(
    partners, llm_server: LLMServer
) -> None:
    """The planner behind a real HTTP model server: our tool schemas and conversations pass a
    server that refuses malformed ones, through the real SDK, with the same effects."""

    def model_turn(seen: SeenRequest) -> Answer:
        plan = plan_refund(ModelRequest(model=MODEL, messages=tuple(seen.messages)))
        if plan.answer is not None:
            return reply(plan.answer)
        return tool_calls(*((c.name, c.arguments) for c in plan.calls))

    llm_server.script(model_turn)
    run = AgentRun()

    final = run.converse(OpenAIChatModel(base_url=llm_server.url, model="served-model"))

    assert final.text.startswith(f"You're booked on SK1240 on {run.new.date}")
    assert llm_server.count() == 6
    assert llm_server.requests[0].tool_names == toolbox.names
    ledger = partners.ledger(workflow_id=run.run_id)
    for kind in (
        "authorizations",
        "seat_cancellations",
        "boarding_passes",
        "crm_updates",
        "emails",
    ):
        assert len(ledger[kind]) == 1, kind


def test_effects__repeated_under_their_keys_happen_once(partners) -> None:
    run = AgentRun()
    run.converse(scripted_refund_model)
    first = {record.name: record.result for record in run.history}

    reference, refund_id = run.request.booking_reference, run.refund_id
    assert run.retry("cancel_seat", booking_reference=reference).result == first["cancel_seat"]
    assert (
        run.retry("charge_customer", refund_id=refund_id, amount_cents=4500).result
        == first["charge_customer"]
    )
    issued = first["issue_boarding_pass"]
    again = run.retry(
        "issue_boarding_pass", booking_reference=reference, flight="SK1240", date=run.new.date
    )
    assert again.result == issued
    run.retry("update_crm", refund_id=refund_id, note=run.history[-2].arguments["note"])

    ledger = partners.ledger(workflow_id=run.run_id)
    for kind in ("seat_cancellations", "authorizations", "boarding_passes", "crm_updates"):
        assert len(ledger[kind]) == 1, kind


# --- guardrails -----------------------------------------------------------------------------
def test_charge__one_cent_is_refused_and_nothing_is_charged(partners) -> None:
    run = AgentRun()
    run.call("load_request", refund_id=run.refund_id)
    run.call("fetch_booking", booking_reference="ABC123")

    with pytest.raises(
        GuardrailViolation,
        match=r"charge \$0\.01, but the change fee for booking ABC123 is \$45\.00",
    ):
        run.call("charge_customer", refund_id=run.refund_id, amount_cents=1)

    assert "payment_intents.create" not in partners.ledger()["requests"]


def test_charge__a_second_charge_is_refused_and_the_model_told(partners) -> None:
    run = AgentRun()
    run.through_charge()

    again = run.call("charge_customer", refund_id=run.refund_id, amount_cents=4500)

    assert again.ok is False and again.result["error"] == "limit_reached"
    assert "charge_customer was not called: a run may make it once" in again.result["message"]
    assert len(partners.ledger(workflow_id=run.run_id)["authorizations"]) == 1


@pytest.mark.parametrize(
    ("tool", "ledger_list"),
    [
        ("cancel_seat", "seat_cancellations"),
        ("issue_boarding_pass", "boarding_passes"),
        ("send_confirmation_email", "emails"),
    ],
)
def test_effects__one_of_each_per_run_the_next_refused(
    partners, tool: str, ledger_list: str
) -> None:
    """One fee never buys a second boarding pass, and the customer is e-mailed once."""
    run = AgentRun()
    run.through_charge()
    arguments = {
        "cancel_seat": {"booking_reference": "abc123"},
        "issue_boarding_pass": {
            "booking_reference": "ABC123",
            "flight": "SK1240",
            "date": run.new.date,
        },
        "send_confirmation_email": {"refund_id": run.refund_id},
    }
    if tool == "send_confirmation_email":
        run.call("issue_boarding_pass", **arguments["issue_boarding_pass"])
    if tool != "cancel_seat":
        assert run.call(tool, **arguments[tool]).ok

    again = [run.call(tool, **arguments[tool]) for _ in range(2)]

    assert [(o.ok, o.result["error"]) for o in again] == [(False, "limit_reached")] * 2
    assert len(partners.ledger(workflow_id=run.run_id)[ledger_list]) == 1


def test_scope__another_booking_or_refund_is_refused(partners) -> None:
    run = AgentRun()
    other = AgentRun(reference="XYZ789")

    with pytest.raises(GuardrailViolation, match="booking XYZ789, which is not the booking"):
        run.call("cancel_seat", booking_reference="XYZ789")
    with pytest.raises(
        GuardrailViolation, match=f"request '{other.refund_id}', not on this request"
    ):
        run.call("charge_customer", refund_id=other.refund_id, amount_cents=4500)
    assert partners.ledger()["requests"].get("payment_intents.create", 0) == 0
    assert partners.ledger(workflow_id=run.run_id)["seat_cancellations"] == []


def test_flex_fare__charges_nothing_and_refuses_a_fee(partners) -> None:
    run = AgentRun(reference="FLX123")
    run.call("fetch_booking", booking_reference="FLX123")
    policy = run.call("check_cancellation_policy", booking_reference="FLX123").result
    assert policy["fee_cents"] == 0

    with pytest.raises(GuardrailViolation, match=r"fee for booking FLX123 is \$0\.00"):
        run.call("charge_customer", refund_id=run.refund_id, amount_cents=4500)
    assert run.call("charge_customer", refund_id=run.refund_id, amount_cents=0).result == {
        "authorized": False,
        "amount_cents": 0,
    }
    assert "payment_intents.create" not in partners.ledger()["requests"]


def test_basic_fare__refused_readably_before_any_effect(partners) -> None:
    run = AgentRun(reference="BAS123")
    with pytest.raises(PermanentStepError, match=r"^Basic fares can't be changed"):
        run.call("check_cancellation_policy", booking_reference="BAS123")
    with pytest.raises(PermanentStepError, match=r"^Basic fares can't be changed"):
        run.call("charge_customer", refund_id=run.refund_id, amount_cents=0)


def test_declined_card__permanent_and_readable(partners) -> None:
    run = AgentRun(reference="DEC123")
    run.call("fetch_booking", booking_reference="DEC123")
    with pytest.raises(PermanentStepError, match=r"^Your card was declined"):
        run.call("charge_customer", refund_id=run.refund_id, amount_cents=4500)
    ledger = partners.ledger(workflow_id=run.run_id)
    assert ledger["payments"] == [] and ledger["authorizations"] == []


def test_seat__not_released_before_the_fee_is_secured(partners) -> None:
    """Finding 5: the seat is touched only once the fee is held, so a declined card can never
    leave the customer without their seat; the model is told what to do first."""
    run = AgentRun()
    outcome = run.call("cancel_seat", booking_reference="ABC123")

    assert outcome.ok is False and "call charge_customer first" in outcome.result["message"]
    assert partners.ledger(workflow_id=run.run_id)["seat_cancellations"] == []


# --- refusals the model reads ------------------------------------------------------------------
def test_boarding_pass__before_cancel_and_charge_is_refused_not_issued(partners) -> None:
    run = AgentRun()
    outcome = run.call(
        "issue_boarding_pass", booking_reference="ABC123", flight="SK1240", date=run.new.date
    )

    assert outcome.ok is False and outcome.result["error"] == "refused"
    assert "call cancel_seat and charge_customer first" in outcome.result["message"]
    assert partners.ledger(workflow_id=run.run_id)["boarding_passes"] == []


def test_boarding_pass__for_a_flight_not_on_the_schedule_is_refused_not_issued(partners) -> None:
    run = AgentRun()
    run.through_charge()
    outcome = run.call(
        "issue_boarding_pass", booking_reference="ABC123", flight="ZZ9999", date=run.new.date
    )

    assert outcome.ok is False and outcome.result["error"] == "refused"
    assert f"We couldn't find flight ZZ9999 on {run.new.in_words}" in outcome.result["message"]
    assert partners.ledger(workflow_id=run.run_id)["boarding_passes"] == []


def test_confirmation__before_the_boarding_pass_is_refused_not_sent(partners) -> None:
    run = AgentRun()
    run.through_charge()
    outcome = run.call("send_confirmation_email", refund_id=run.refund_id)

    assert outcome.ok is False
    assert outcome.result["message"].endswith(
        "needs the results of issue_boarding_pass from this request first"
    )
    assert partners.ledger(workflow_id=run.run_id)["emails"] == []


def test_invalid_arguments__not_executed_and_explained(partners) -> None:
    run = AgentRun()
    run.through_charge()
    outcome = run.call(
        "issue_boarding_pass",
        booking_reference="ABC123",
        flight="SK1240",
        date=run.new.day.strftime("%d/%m/%Y"),
    )

    assert outcome.ok is False and outcome.result["error"] == "invalid_arguments"
    assert outcome.result["problems"][0]["field"] == "date"
    assert partners.ledger(workflow_id=run.run_id)["boarding_passes"] == []


# --- compensation and reconcile -------------------------------------------------------------------
def test_refund_fee__the_engine_s_alone_under_its_key(partners) -> None:
    run = AgentRun()
    run.through_charge()

    undone = run.undo("refund_fee", refund_id=run.refund_id)

    # Only held, never taken: the hold is released, and there is nothing to refund.
    assert undone.ok and (undone.result["hold_released"], undone.result["amount_cents"]) == (
        True,
        4500,
    )
    ledger = partners.ledger(workflow_id=run.run_id)
    [released] = ledger["authorization_cancels"]
    assert released["idempotency_key"] == run.key("refund_fee")
    assert ledger["refunds"] == [] and ledger["payments"] == []
    assert toolbox.compensation_call(
        "charge_customer", {"refund_id": run.refund_id, "amount_cents": 4500}
    ) == (
        "refund_fee",
        {"refund_id": run.refund_id},
    )


def test_refund_fee__not_a_tool_the_model_can_call_before_or_after_a_charge(partners) -> None:
    """Finding 1: a model calling refund_fee before any charge recorded {"refunded": false}
    as done, which a failing run then reused instead of refunding; called after the charge it
    gave the fee back and still got the boarding pass."""
    run = AgentRun()
    assert "refund_fee" not in toolbox.names

    before = run.call("refund_fee", refund_id=run.refund_id)
    run.through_charge()
    after = run.call("refund_fee", refund_id=run.refund_id)

    assert [(o.ok, o.result["error"]) for o in (before, after)] == [(False, "unknown_tool")] * 2
    ledger = partners.ledger(workflow_id=run.run_id)
    assert ledger["refunds"] == [] and len(ledger["authorizations"]) == 1


def test_refund_fee__nothing_charged_nothing_refunded(partners) -> None:
    run = AgentRun(reference="FLX123")
    run.through_charge(fee=0)
    assert run.undo("refund_fee", refund_id=run.refund_id).result == {
        "refunded": False,
        "hold_released": False,
        "amount_cents": 0,
    }
    assert "refunds.create" not in partners.ledger()["requests"]


def test_charge_reconcile__adopts_the_payment_made_before_a_crash(partners) -> None:
    run = AgentRun()
    run.call("load_request", refund_id=run.refund_id)
    run.call("fetch_booking", booking_reference="ABC123")
    prepared = toolbox.prepare(
        "charge_customer", {"refund_id": run.refund_id, "amount_cents": 4500}
    )
    position = run.position + 1
    with pytest.raises(OutcomeUnknown):  # nothing yet, but search can lag: no proof
        prepared.reconcile(run.ctx("charge_customer", position))

    charged = prepared.run(run.ctx("charge_customer", position))  # ...then the worker died
    adopted = prepared.reconcile(run.ctx("charge_customer", position, attempt=2))

    assert adopted == charged
    assert len(partners.ledger(workflow_id=run.run_id)["authorizations"]) == 1
    assert toolbox["charge_customer"].key_window_seconds == 24 * 3600
