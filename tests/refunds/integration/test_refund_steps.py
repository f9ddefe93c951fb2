"""The refund steps run directly, one by one, for a real RefundRequest row against the sandbox.

Each step gets a StepContext built by hand with the outputs of the steps before it, the way the
runtime would give them; effects are counted in the sandbox's ledger.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone

from agentflow import durable
from agentflow._base.context import UndoneCall
from agentflow.durable import PermanentStepError, StepContext
from agentflow.models import StepCheckpoint, WorkflowRun
from refunds import steps
from refunds.models import RefundRequest
from refunds.ownership import MISMATCH
from refunds.sandbox.airline import owner_of
from refunds.workflows import refund
from tests.support.airline_days import new_flight

SEQ = {name: seq for seq, name in enumerate(refund.forward_steps, start=1)}

pytestmark = pytest.mark.django_db


#: Compensation -> the forward step it undoes.
UNDOES = {"refund_fee": "charge_customer", "reinstate_seat": "cancel_seat"}


class Flow:
    """One refund's steps run in order by hand, feeding each the outputs before it."""

    def __init__(
        self,
        reference: str = "ABC123",
        message: str = "",
        *,
        last_name: str | None = None,
        email: str | None = None,
    ) -> None:
        self.run_id = f"wf_{secrets.token_hex(16)}"
        self.owner = owner_of(reference)
        self.new = new_flight()  # what the customer asks for unless `message` says otherwise
        self.request = RefundRequest.objects.create(
            email=self.owner.email if email is None else email,
            last_name=self.owner.last_name if last_name is None else last_name,
            booking_reference=reference,
            message=message or self.new.words(),
            submission_token=secrets.token_hex(16),
            workflow_id=self.run_id,
        )
        self.outputs: dict[str, Any] = {}

    def ctx(self, step: str, seq: int | None = None, *, attempt: int = 1) -> StepContext:
        earlier = dict(self.outputs)
        return StepContext(
            run_id=self.run_id,
            workflow="refund",
            seq=seq or SEQ[step],
            step=step,
            attempt=attempt,
            input={"refund_id": self.request.public_id},
            load_outputs=lambda: earlier,
            load_calls=list,  # no earlier agent calls: a graph run's outputs say it all
            undoes=self.undone(UNDOES[step]) if step in UNDOES else None,
        )

    def undone(self, step: str) -> UndoneCall:
        """The call `step` as the engine hands it to the compensation that undoes it."""
        seq = SEQ[step]
        return UndoneCall(
            name=step,
            seq=seq,
            branch=0,
            status="COMPLETED",
            arguments=None,
            output=self.outputs.get(step),
            idempotency_key=f"{self.run_id}_step_{seq}",
        )

    def key(self, step: str) -> str:
        return self.ctx(step).idempotency_key

    def run(self, step: str, seq: int | None = None) -> Any:
        output = refund.steps[step].fn(self.ctx(step, seq))  # the function the workflow runs
        assert json.loads(json.dumps(output)) == output  # outputs are checkpointed as JSON
        self.outputs[step] = output
        return output

    def run_through(self, last: str) -> Any:
        for name in refund.forward_steps[: refund.forward_steps.index(last) + 1]:
            output = self.run(name)
        return output


def test_steps__standard_fare_rebooks_charges_45_dollars_and_confirms(partners) -> None:
    flow = Flow()
    flow.run_through("send_confirmation_email")
    out = flow.outputs

    assert out["load_request"]["booking_reference"] == "ABC123"
    assert (out["parse_flight_details"]["flight"], out["parse_flight_details"]["date"]) == (
        "SK1240",
        flow.new.date,
    )
    assert out["fetch_booking"]["fare_class"] == "standard"
    assert out["calculate_penalty_fee"] == {"amount_cents": 4500, "currency": "usd"}
    assert out["cancel_seat"]["status"] == "released"
    assert out["charge_customer"]["authorized"] is True
    assert out["charge_customer"]["amount_cents"] == 4500
    assert out["capture_fee"]["captured"] is True
    assert (out["issue_boarding_pass"]["flight"], out["issue_boarding_pass"]["date"]) == (
        "SK1240",
        flow.new.date,
    )

    ledger = partners.ledger(workflow_id=flow.run_id)
    assert [a["idempotency_key"] for a in ledger["authorizations"]] == [flow.key("charge_customer")]
    assert [p["idempotency_key"] for p in ledger["payments"]] == [flow.key("capture_fee")]
    assert ledger["payments"][0]["amount"] == 4500
    assert ledger["payments"][0]["id"] == out["charge_customer"]["payment_intent_id"]
    assert ledger["payments"][0]["metadata"]["refund_id"] == flow.request.public_id
    assert [c["idempotency_key"] for c in ledger["seat_cancellations"]] == [flow.key("cancel_seat")]
    assert [b["id"] for b in ledger["boarding_passes"]] == [
        out["issue_boarding_pass"]["boarding_pass_id"]
    ]
    assert [c["id"] for c in ledger["crm_updates"]] == [out["update_crm"]["update_id"]]
    assert "Fee: $45.00" in ledger["crm_updates"][0]["note"]
    [email] = ledger["emails"]
    assert email["message_id"] == out["send_confirmation_email"]["message_id"]
    assert email["message_id"] == f"<{flow.key('send_confirmation_email')}@agentflow.refunds>"
    assert email["to"] == [flow.owner.email]
    assert email["subject"] == f"Your flight change is confirmed: SK1240 on {flow.new.in_words}"


def test_steps__every_effect_repeated_under_its_key_happens_once(partners) -> None:
    flow = Flow()
    flow.run_through("update_crm")
    first = dict(flow.outputs)

    for name in ("charge_customer", "cancel_seat", "issue_boarding_pass", "capture_fee"):
        assert flow.run(name) == first[name]
    assert flow.run("update_crm") == first["update_crm"]

    ledger = partners.ledger(workflow_id=flow.run_id)
    for kind in (
        "authorizations",
        "seat_cancellations",
        "payments",
        "boarding_passes",
        "crm_updates",
    ):
        assert len(ledger[kind]) == 1, kind


def test_confirmation_email__friendly_text_with_pass_seat_and_fee(partners, settings) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"

    flow = Flow()
    flow.run_through("send_confirmation_email")

    [message] = mail.outbox
    issued = flow.outputs["issue_boarding_pass"]
    assert (
        message.extra_headers["Message-ID"]
        == f"<{flow.key('send_confirmation_email')}@agentflow.refunds>"
    )
    assert message.extra_headers["X-Agentflow-Workflow"] == flow.run_id
    body = message.body
    booking = flow.outputs["fetch_booking"]
    assert body.startswith(f"Hi {booking['passenger_name']},")
    assert message.to == [booking["contact_email"]]
    for text in (
        issued["boarding_pass_id"],
        f"New seat:       {issued['seat']}",
        f"New flight:     SK1240 on {flow.new.in_words}",
        "Change fee:     $45.00, charged to your card",
        f"no longer booked on {booking['flight']}",
    ):
        assert text in body
    assert "&#x27;" not in body and "{{" not in body


def test_charge_customer__flex_fare_is_free_and_calls_no_stripe(partners) -> None:
    flow = Flow(reference="FLX123")
    flow.run_through("calculate_penalty_fee")

    assert flow.run("charge_customer") == {"authorized": False, "amount_cents": 0}
    assert steps.find_fee_hold(flow.ctx("charge_customer")) is None
    assert "payment_intents.create" not in partners.ledger()["requests"]


def test_find_fee_hold__adopts_the_hold_made_before_a_crash(partners) -> None:
    flow = Flow()
    flow.run_through("calculate_penalty_fee")
    # Nothing held yet, but search can lag a minute: "not found" is no proof of absence.
    with pytest.raises(durable.OutcomeUnknown, match="search shows no payment"):
        steps.find_fee_hold(flow.ctx("charge_customer"))

    held = steps.charge_customer(flow.ctx("charge_customer"))  # ...then the worker died
    adopted = steps.find_fee_hold(flow.ctx("charge_customer", attempt=2))

    assert adopted == held
    assert len(partners.ledger(workflow_id=flow.run_id)["authorizations"]) == 1


def test_load_request__missing_request_is_permanent(partners) -> None:
    flow = Flow()
    flow.request.delete()
    with pytest.raises(PermanentStepError, match="couldn't find your request"):
        flow.run("load_request")


def test_fetch_booking__unknown_booking_fails_like_a_mismatch(partners) -> None:
    """Which references exist is not for the form to tell."""
    partners.set_fault(unknown_bookings=["NOP123"])
    flow = Flow(reference="NOP123")
    flow.run_through("parse_flight_details")
    with pytest.raises(PermanentStepError) as raised:
        flow.run("fetch_booking")
    assert str(raised.value) == MISMATCH


@pytest.mark.parametrize(
    ("last_name", "email"),
    [
        pytest.param("Eriksson", None, id="wrong-surname"),
        pytest.param(None, "camille.eriksen@example.com", id="wrong-email"),
        pytest.param("Åberg", "elena.aberg.xyz789@example.com", id="someone-elses-booking"),
        pytest.param("", "", id="nothing"),
    ],
)
def test_fetch_booking__a_request_not_from_the_owner_fails_with_the_one_message(
    partners, last_name: str | None, email: str | None
) -> None:
    flow = Flow(last_name=last_name, email=email)
    flow.run_through("parse_flight_details")
    with pytest.raises(PermanentStepError) as raised:
        flow.run("fetch_booking")
    assert str(raised.value) == MISMATCH == "These details don't match a booking."


def test_fetch_booking__owner_found_with_case_accents_and_spaces_ignored(partners) -> None:
    flow = Flow(reference="XYZ789", last_name="  ABERG ", email="Elena.Aberg.XYZ789@EXAMPLE.com")
    flow.run_through("parse_flight_details")
    booking = flow.run("fetch_booking")
    assert (booking["passenger_last_name"], booking["contact_email"]) == (
        "Åberg",
        "elena.aberg.xyz789@example.com",
    )


def test_check_cancellation_policy__basic_fare_is_refused_readably(partners) -> None:
    flow = Flow(reference="BAS123")
    flow.run_through("fetch_booking")
    with pytest.raises(PermanentStepError, match=r"^Basic fares can't be changed"):
        flow.run("check_cancellation_policy")


def test_charge_customer__declined_card_is_permanent_and_charges_nothing(partners) -> None:
    flow = Flow(reference="DEC123")
    flow.run_through("calculate_penalty_fee")
    with pytest.raises(PermanentStepError, match=r"^Your card was declined"):
        flow.run("charge_customer")
    ledger = partners.ledger(workflow_id=flow.run_id)
    assert ledger["payments"] == [] and ledger["authorizations"] == []


def test_parse_flight_details__form_reference_wins(partners) -> None:
    flow = Flow(message="booking ref XYZ789: move me to next friday please")
    flow.run("load_request")
    parsed = flow.run("parse_flight_details")
    assert parsed["booking_reference"] == "ABC123"
    assert parsed["intent"] == "rebook"
    assert parsed["notes"] == ["message mentions booking XYZ789; using ABC123 from the form"]


def test_refund_fee__refunds_the_fee_once_under_its_own_key(partners) -> None:
    flow = Flow()
    flow.run_through("capture_fee")
    seq = SEQ["update_crm"] + 1  # compensation runs after the failed step

    first = flow.run("refund_fee", seq)
    again = flow.run("refund_fee", seq)

    assert first == again
    assert (first["refunded"], first["amount_cents"]) == (True, 4500)
    [entry] = partners.ledger(workflow_id=flow.run_id)["refunds"]
    assert entry["payment_intent"] == flow.outputs["charge_customer"]["payment_intent_id"]
    assert entry["idempotency_key"] == flow.ctx("refund_fee", seq).idempotency_key


def test_refund_fee__skips_when_nothing_was_charged(partners) -> None:
    flow = Flow(reference="FLX123")
    flow.run_through("charge_customer")
    assert flow.run("refund_fee", 9) == {
        "refunded": False,
        "hold_released": False,
        "amount_cents": 0,
    }
    requests = partners.ledger()["requests"]
    assert "refunds.create" not in requests and "payment_intents.cancel" not in requests


def record_failure(flow: Flow, step: str, error: str) -> int:
    """The engine's rows for a run that failed at `step` (what notify_failure reads)."""
    now = timezone.now()
    run = WorkflowRun.objects.create(
        id=flow.run_id,
        workflow="refund",
        version=1,
        status="RUNNING",
        wake_at=now,
        current_step="notify_failure",
        current_seq=SEQ[step] + 2,
        error=f"{step}: {error}",
    )
    StepCheckpoint.objects.create(
        run=run,
        seq=SEQ[step],
        name=step,
        kind="effect",
        status="FAILED",
        error=error,
        idempotency_key=f"{flow.run_id}_step_{SEQ[step]}",
        first_started_at=now,
        started_at=now,
    )
    return SEQ[step] + 2


def test_notify_failure__says_why_and_that_the_fee_was_refunded(partners, settings) -> None:
    flow = Flow()
    flow.run_through("capture_fee")
    flow.run("refund_fee", SEQ["update_crm"] + 1)
    seq = record_failure(flow, "issue_boarding_pass", "gave up after 5 attempts: HTTP 500")
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"

    output = flow.run("notify_failure", seq)

    assert output["reason"] == "The airline couldn't issue your new boarding pass."
    [message] = mail.outbox
    assert message.subject == "We couldn't change your booking ABC123"
    assert message.to == [flow.owner.email]
    assert "The airline couldn't issue your new boarding pass." in message.body
    assert "refunded it in full" in message.body
    assert flow.outputs["refund_fee"]["refund_id"] in message.body
    assert flow.outputs["cancel_seat"]["seat"] in message.body  # the released seat is owned up to


def test_notify_failure__readable_reason_is_passed_on_over_smtp(partners) -> None:
    flow = Flow(reference="DEC123")
    flow.run_through("calculate_penalty_fee")
    seq = record_failure(flow, "charge_customer", "Your card was declined.")

    output = flow.run("notify_failure", seq)

    assert output["reason"] == "Your card was declined."
    [email] = partners.ledger(workflow_id=flow.run_id)["emails"]
    assert email["message_id"] == output["message_id"]
    assert email["subject"] == "We couldn't change your booking DEC123"


def test_notify_failure__sends_nothing_for_a_request_not_from_the_owner(partners) -> None:
    flow = Flow(last_name="Eriksson")
    flow.run_through("parse_flight_details")
    with pytest.raises(PermanentStepError):
        flow.run("fetch_booking")
    seq = record_failure(flow, "fetch_booking", MISMATCH)

    assert flow.run("notify_failure", seq) == {"sent": False, "reason": MISMATCH}
    assert partners.ledger(workflow_id=flow.run_id)["emails"] == []


def test_notify_failure__says_what_did_not_change(partners, settings) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    flow = Flow(reference="BAS123")
    flow.run_through("fetch_booking")
    seq = record_failure(flow, "check_cancellation_policy", "Basic fares can't be changed.")

    flow.run("notify_failure", seq)

    [message] = mail.outbox
    booking = flow.outputs["fetch_booking"]
    assert message.to == [booking["contact_email"]]
    assert "What did not change: your booking is exactly as it was." in message.body
    assert f"You are still on {booking['flight']} on " in message.body
    assert f"seat {booking['seat']}" in message.body


def test_charge_customer__stolen_card_reaches_the_customer_as_the_generic_decline(
    partners,
) -> None:
    flow = Flow(reference="STL123")
    flow.run_through("calculate_penalty_fee")
    with pytest.raises(PermanentStepError) as raised:
        flow.run("charge_customer")
    assert str(raised.value) == "Your card was declined."
