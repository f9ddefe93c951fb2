"""The fee hold's steps (and the agent's compensation tools) run by hand against the sandbox, as
test_refund_steps does: the hold taken once, released or refunded by the one compensation as the
payment stands at Stripe, and a released seat given back; counted at the partners' ledger."""

from __future__ import annotations

import pytest
import requests
from django.core import mail
from django.utils import timezone

from agentflow.durable import PermanentStepError
from agentflow.models import WorkflowRun
from refunds import steps
from refunds.agent import guardrails
from refunds.agent.guardrails import GuardrailViolation
from tests.refunds.integration.test_agent_tools import AgentRun
from tests.refunds.integration.test_refund_steps import SEQ, Flow, record_failure

pytestmark = pytest.mark.django_db

UNDO_SEQ = SEQ["send_confirmation_email"] + 1  # compensations run after the forward steps


def seat_held(partners, reference: str) -> bool:
    booking = requests.get(f"{partners.url}/airline/bookings/{reference}", timeout=10)
    return booking.json()["seat_held"]


def test_capture_fee__takes_the_held_fee_once_under_its_key(partners) -> None:
    flow = Flow()
    flow.run_through("issue_boarding_pass")
    assert steps.find_fee_capture(flow.ctx("capture_fee")) is None  # held, not taken yet

    taken = flow.run("capture_fee")
    again = flow.run("capture_fee")

    assert taken == again
    assert (taken["captured"], taken["amount_cents"]) == (True, 4500)
    assert steps.find_fee_capture(flow.ctx("capture_fee", attempt=2)) == taken  # the reconcile
    [payment] = partners.ledger(workflow_id=flow.run_id)["payments"]
    assert (payment["id"], payment["idempotency_key"]) == (
        flow.outputs["charge_customer"]["payment_intent_id"],
        flow.key("capture_fee"),
    )


def test_capture_fee__without_a_boarding_pass_takes_nothing(partners) -> None:
    flow = Flow()
    flow.run_through("cancel_seat")
    with pytest.raises(PermanentStepError, match="did not take the change fee"):
        steps.capture_fee(flow.ctx("capture_fee"))
    assert partners.ledger(workflow_id=flow.run_id)["payments"] == []


def test_refund_fee__a_fee_only_held_is_released_not_refunded(partners) -> None:
    flow = Flow()
    flow.run_through("issue_boarding_pass")
    assert steps.find_fee_refund(flow.ctx("refund_fee", UNDO_SEQ)) is None  # nothing given back

    first = flow.run("refund_fee", UNDO_SEQ)
    again = flow.run("refund_fee", UNDO_SEQ)

    assert (
        first
        == again
        == {
            "refunded": False,
            "hold_released": True,
            "amount_cents": 4500,
            "currency": "usd",
        }
    )
    assert steps.find_fee_refund(flow.ctx("refund_fee", UNDO_SEQ)) == first  # the reconcile
    ledger = partners.ledger(workflow_id=flow.run_id)
    assert ledger["payments"] == [] and ledger["refunds"] == []
    assert [c["idempotency_key"] for c in ledger["authorization_cancels"]] == [
        flow.ctx("refund_fee", UNDO_SEQ).idempotency_key
    ]


def test_refund_fee__reconcile_finds_the_refund_of_a_taken_fee(partners) -> None:
    flow = Flow()
    flow.run_through("capture_fee")
    ctx = flow.ctx("refund_fee", UNDO_SEQ)
    assert steps.find_fee_refund(ctx) is None

    made = flow.run("refund_fee", UNDO_SEQ)

    assert made["refunded"] is True
    assert steps.find_fee_refund(ctx) == made
    ledger = partners.ledger(workflow_id=flow.run_id)
    assert sum(p["amount"] for p in ledger["payments"]) == sum(
        r["amount"] for r in ledger["refunds"]
    )


def test_reinstate_seat__gives_the_released_seat_back_once(partners) -> None:
    flow = Flow(reference="RNS200")
    flow.run_through("cancel_seat")
    ctx = flow.ctx("reinstate_seat", UNDO_SEQ)
    assert steps.find_seat_reinstatement(ctx) is None
    assert seat_held(partners, "RNS200") is False

    first = flow.run("reinstate_seat", UNDO_SEQ)
    again = flow.run("reinstate_seat", UNDO_SEQ)

    assert first == again
    assert (first["reinstated"], first["seat"]) == (True, flow.outputs["cancel_seat"]["seat"])
    assert steps.find_seat_reinstatement(ctx) == first
    ledger = partners.ledger(workflow_id=flow.run_id)
    assert [r["idempotency_key"] for r in ledger["seat_reinstatements"]] == [ctx.idempotency_key]
    assert seat_held(partners, "RNS200") is True  # the airline's own view


def test_reinstate_seat__nothing_released_nothing_to_give_back(partners) -> None:
    flow = Flow()
    flow.run_through("charge_customer")
    assert flow.run("reinstate_seat", UNDO_SEQ) == {"reinstated": False}
    assert "airline.reinstate_seat" not in partners.ledger()["requests"]


def test_notify_failure__a_guardrail_failure_reaches_the_customer_in_its_own_words(
    partners, settings
) -> None:
    """Finding 4: an agent run its guardrails stopped at the charge used to tell the customer
    "We couldn't reach our payment provider"; it now says what was refused, in their words
    (the catalogue's sentence, with the amounts and the reference as its facts)."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    flow = Flow()
    flow.run_through("calculate_penalty_fee")
    with pytest.raises(GuardrailViolation) as refused:
        guardrails.check_charge_amount(1, fee_cents=4500, reference="ABC123")
    seq = record_failure(flow, "charge_customer", str(refused.value))

    output = flow.run("notify_failure", seq)

    assert output["reason"] == str(refused.value)
    assert output["reason"].startswith("We stopped this change: our automated assistant asked")
    assert "payment provider" not in output["reason"]
    [message] = mail.outbox
    assert f"Why: {refused.value}" in message.body
    assert "You have not been charged anything." in message.body


def test_notify_failure__an_agent_out_of_turns_is_told_in_words_for_the_customer(
    partners, settings
) -> None:
    """Finding 4: a run the engine stopped at its turn limit (no step failed: the run's error
    is the engine's) used to reach the customer as "Something went wrong on our side"."""
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    flow = Flow()
    flow.run_through("calculate_penalty_fee")
    WorkflowRun.objects.create(
        id=flow.run_id,
        workflow="refund_agent",
        version=2,
        status="RUNNING",
        wake_at=timezone.now(),
        current_step="notify_failure",
        current_seq=20,
        error="The agent used all 20 of its model turns without finishing.",
    )

    output = flow.run("notify_failure", 20)

    assert output["reason"].startswith("We stopped this change: our automated assistant could")
    [message] = mail.outbox
    assert f"Why: {output['reason']}" in message.body


def test_agent_refund_fee__an_early_nothing_to_give_back_does_not_hide_a_later_hold(
    partners,
) -> None:
    """Finding 1, first plan: a model that calls refund_fee before any charge is refused (it is
    the engine's compensation, not a tool) and records nothing to reuse; the later hold is still
    released when the run fails."""
    run = AgentRun()
    early = run.call("refund_fee", refund_id=run.refund_id)
    assert (early.ok, early.result["error"]) == (False, "unknown_tool")
    run.through_charge()

    undo = run.undo("refund_fee", refund_id=run.refund_id)  # as the engine's compensation runs it

    assert undo.result["hold_released"] is True
    ledger = partners.ledger(workflow_id=run.run_id)
    assert len(ledger["authorization_cancels"]) == 1
    assert [a["status"] for a in ledger["authorizations"]] == ["canceled"]
