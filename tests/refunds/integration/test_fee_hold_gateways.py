"""The fee hold's partner calls against the real sandbox: capture, hold release, the consistent
payment read their reconciles use, and the airline's seat reinstatement with its lookup by key."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentflow.durable import PermanentStepError, RetryableStepError
from agentflow.testing.waiting import wait_for
from refunds.gateways import AirlineGateway, HoldLapsed, PaymentGateway
from tests.support.sandbox import SandboxProcess, start_sandbox

WF = "wf_holdgateway"


def key(seq: int) -> str:
    return f"{WF}_step_{seq}"


@pytest.fixture
def stripe_gw(clean_sandbox: SandboxProcess) -> PaymentGateway:
    return PaymentGateway(api_key="sk_test_gateways", api_base=clean_sandbox.url)


def hold(gateway: PaymentGateway, *, seq: int = 6):
    return gateway.authorize(
        amount_cents=4500,
        currency="usd",
        payment_method="pm_card_visa",
        description="Change fee for booking ABC123",
        key=key(seq),
        workflow_id=WF,
    )


# --- capture --------------------------------------------------------------------------------
def test_capture__takes_the_held_fee_once(stripe_gw, clean_sandbox) -> None:
    held = hold(stripe_gw)

    first = stripe_gw.capture(payment_intent_id=held.id, key=key(9))
    again = stripe_gw.capture(payment_intent_id=held.id, key=key(9))

    assert first == again and (first.id, first.status) == (held.id, "succeeded")
    ledger = clean_sandbox.ledger(workflow_id=WF)
    assert [(p["id"], p["idempotency_key"], p["amount"]) for p in ledger["payments"]] == [
        (held.id, key(9), 4500)
    ]


def test_capture__already_taken_under_a_forgotten_key_is_the_same_success(
    stripe_gw, clean_sandbox
) -> None:
    held = hold(stripe_gw)
    stripe_gw.capture(payment_intent_id=held.id, key=key(9))

    again = stripe_gw.capture(payment_intent_id=held.id, key="a-key-stripe-never-saw")

    assert again.status == "succeeded"
    assert len(clean_sandbox.ledger(workflow_id=WF)["payments"]) == 1


def test_capture__of_a_released_hold_is_hold_lapsed(stripe_gw, clean_sandbox) -> None:
    held = hold(stripe_gw)
    stripe_gw.cancel_authorization(payment_intent_id=held.id, key=key(20))

    with pytest.raises(HoldLapsed, match=r"^Your card's hold .* not been charged"):
        stripe_gw.capture(payment_intent_id=held.id, key=key(9))
    assert clean_sandbox.ledger(workflow_id=WF)["payments"] == []


def test_capture__of_a_lapsed_hold_is_hold_lapsed(tmp_path: Path) -> None:
    server = start_sandbox(tmp_path / "lapse", authorization_seconds=1)
    try:
        gateway = PaymentGateway(api_key="sk_test_gateways", api_base=server.url)
        held = hold(gateway)
        wait_for(
            lambda: gateway.payment(held.id).status == "canceled",
            timeout=10,
            interval=0.2,
            what="the hold to lapse",
        )

        with pytest.raises(HoldLapsed):
            gateway.capture(payment_intent_id=held.id, key=key(9))
        assert server.ledger()["payments"] == []
    finally:
        server.stop()


def test_capture__server_error_storm_is_retryable(stripe_gw, clean_sandbox) -> None:
    held = hold(stripe_gw)
    clean_sandbox.set_fault(endpoint="payment_intents.capture", error_rate=1.0, error_status=500)

    with pytest.raises(RetryableStepError):
        stripe_gw.capture(payment_intent_id=held.id, key=key(9))
    assert clean_sandbox.ledger(workflow_id=WF)["payments"] == []


# --- hold release ---------------------------------------------------------------------------
def test_cancel_authorization__releases_once_and_again_is_the_same(
    stripe_gw, clean_sandbox
) -> None:
    held = hold(stripe_gw)

    first = stripe_gw.cancel_authorization(payment_intent_id=held.id, key=key(20))
    other_key = stripe_gw.cancel_authorization(payment_intent_id=held.id, key=key(21))

    assert (first.status, other_key.status) == ("canceled", "canceled")
    ledger = clean_sandbox.ledger(workflow_id=WF)
    assert [(c["id"], c["idempotency_key"]) for c in ledger["authorization_cancels"]] == [
        (held.id, key(20))
    ]
    assert ledger["payments"] == []


def test_cancel_authorization__of_a_captured_fee_is_permanent(stripe_gw) -> None:
    held = hold(stripe_gw)
    stripe_gw.capture(payment_intent_id=held.id, key=key(9))

    with pytest.raises(PermanentStepError, match="hold release"):
        stripe_gw.cancel_authorization(payment_intent_id=held.id, key=key(20))


# --- the consistent read the reconciles use -----------------------------------------------------
def test_payment__reads_the_intent_as_it_is_now(stripe_gw) -> None:
    held = hold(stripe_gw)
    assert stripe_gw.payment(held.id).status == "requires_capture"
    stripe_gw.capture(payment_intent_id=held.id, key=key(9))
    assert stripe_gw.payment(held.id).status == "succeeded"


def test_find_payment_by_key__finds_a_hold(stripe_gw) -> None:
    held = hold(stripe_gw)
    assert stripe_gw.find_payment_by_key(key(6)) == held
    assert stripe_gw.find_payment_by_key(key(99)) is None


# --- seat reinstatement ---------------------------------------------------------------------
def test_reinstate_seat__gives_the_seat_back_once(clean_sandbox) -> None:
    airline = AirlineGateway(clean_sandbox.url)
    released = airline.cancel_seat("ABC123", key=key(7), workflow_id=WF)

    first = airline.reinstate_seat(
        "ABC123", cancellation_id=released.cancellation_id, key=key(30), workflow_id=WF
    )
    again = airline.reinstate_seat(
        "ABC123", cancellation_id=released.cancellation_id, key=key(30), workflow_id=WF
    )

    assert first == again
    assert (first.seat, first.status) == (released.seat, "held")
    [entry] = clean_sandbox.ledger(workflow_id=WF)["seat_reinstatements"]
    assert (entry["id"], entry["idempotency_key"]) == (first.reinstatement_id, key(30))


def test_find_seat_reinstatement__finds_the_one_made_under_the_key(clean_sandbox) -> None:
    airline = AirlineGateway(clean_sandbox.url)
    released = airline.cancel_seat("ABC123", key=key(7), workflow_id=WF)
    made = airline.reinstate_seat(
        "ABC123", cancellation_id=released.cancellation_id, key=key(30), workflow_id=WF
    )

    assert airline.find_seat_reinstatement(key=key(30)) == made
    assert airline.find_seat_reinstatement(key=key(99)) is None
