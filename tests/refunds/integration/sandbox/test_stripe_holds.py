"""Manual capture as the real `stripe` library sees it: hold, capture, cancel, lapse, ledger."""

from __future__ import annotations

from pathlib import Path

import pytest
import stripe

from agentflow.testing.waiting import wait_for
from tests.refunds.integration.sandbox.clients import intent_params, make_stripe_client
from tests.support.sandbox import start_sandbox


def _hold(client: stripe.StripeClient, key: str, **extra):
    return client.v1.payment_intents.create(
        intent_params("wf-hold", capture_method="manual", **extra),
        options={"idempotency_key": key},
    )


def test_manual_intent__holds_without_taking_money(stripe_client, clean_sandbox, new_key):
    key = new_key("hold")
    intent = _hold(stripe_client, key)

    assert (intent.status, intent.capture_method) == ("requires_capture", "manual")
    assert (intent.amount_capturable, intent.amount_received) == (4500, 0)
    assert stripe_client.v1.payment_intents.retrieve(intent.id).status == "requires_capture"
    ledger = clean_sandbox.ledger()
    assert ledger["payments"] == []  # nothing taken yet
    assert [(a["id"], a["idempotency_key"], a["status"]) for a in ledger["authorizations"]] == [
        (intent.id, key, "requires_capture")
    ]


def test_capture__takes_the_money_once_under_its_key(stripe_client, clean_sandbox, new_key):
    intent = _hold(stripe_client, new_key("hold"))
    key = new_key("capture")

    first = stripe_client.v1.payment_intents.capture(intent.id, options={"idempotency_key": key})
    again = stripe_client.v1.payment_intents.capture(intent.id, options={"idempotency_key": key})

    assert (first.status, first.amount_received, first.amount_capturable) == ("succeeded", 4500, 0)
    assert again.last_response.headers["Idempotent-Replayed"] == "true"
    ledger = clean_sandbox.ledger()
    assert [
        (p["id"], p["idempotency_key"], p["amount"], p["capture_method"])
        for p in ledger["payments"]
    ] == [(intent.id, key, 4500, "manual")]
    assert ledger["authorizations"][0]["status"] == "succeeded"
    # Another key cannot take it twice: Stripe says the intent is no longer capturable.
    with pytest.raises(stripe.InvalidRequestError) as refused:
        stripe_client.v1.payment_intents.capture(
            intent.id, options={"idempotency_key": new_key("capture")}
        )
    assert refused.value.code == "payment_intent_unexpected_state"
    assert len(clean_sandbox.ledger()["payments"]) == 1


def test_cancel__releases_the_hold_and_it_can_no_longer_be_captured(
    stripe_client, clean_sandbox, new_key
):
    intent = _hold(stripe_client, new_key("hold"))
    key = new_key("cancel")

    cancelled = stripe_client.v1.payment_intents.cancel(
        intent.id, {"cancellation_reason": "abandoned"}, options={"idempotency_key": key}
    )

    assert (cancelled.status, cancelled.cancellation_reason) == ("canceled", "abandoned")
    with pytest.raises(stripe.InvalidRequestError):
        stripe_client.v1.payment_intents.capture(
            intent.id, options={"idempotency_key": new_key("capture")}
        )
    with pytest.raises(stripe.InvalidRequestError):  # nothing was taken: nothing to refund
        stripe_client.v1.refunds.create({"payment_intent": intent.id})
    ledger = clean_sandbox.ledger()
    assert ledger["payments"] == [] and ledger["refunds"] == []
    assert [
        (c["id"], c["idempotency_key"], c["amount"]) for c in ledger["authorization_cancels"]
    ] == [(intent.id, key, 4500)]


def test_cancel__of_a_captured_intent_is_refused(stripe_client, clean_sandbox, new_key):
    intent = _hold(stripe_client, new_key("hold"))
    stripe_client.v1.payment_intents.capture(
        intent.id, options={"idempotency_key": new_key("capture")}
    )

    with pytest.raises(stripe.InvalidRequestError) as refused:
        stripe_client.v1.payment_intents.cancel(
            intent.id, options={"idempotency_key": new_key("cancel")}
        )
    assert refused.value.code == "payment_intent_unexpected_state"
    assert clean_sandbox.ledger()["authorization_cancels"] == []


def test_manual_intent__declined_card_holds_nothing(stripe_client, clean_sandbox, new_key):
    with pytest.raises(stripe.CardError):
        _hold(stripe_client, new_key("hold"), payment_method="pm_card_chargeDeclined")
    ledger = clean_sandbox.ledger()
    assert ledger["authorizations"] == [] and ledger["payments"] == []


def test_manual_intent__found_by_search_on_its_key(stripe_client, clean_sandbox, new_key):
    key = new_key("hold")
    intent = _hold(stripe_client, key, metadata={"workflow_id": "wf-hold", "idempotency_key": key})

    found = stripe_client.v1.payment_intents.search(
        {"query": f"metadata['idempotency_key']:'{key}'"}
    )
    assert [i.id for i in found.data] == [intent.id]


def test_hold__lapses_after_the_authorization_window(tmp_path: Path, new_key):
    server = start_sandbox(tmp_path / "short-holds", authorization_seconds=1)
    try:
        client = make_stripe_client(server.url)
        intent = _hold(client, new_key("hold"))

        lapsed = wait_for(
            lambda: client.v1.payment_intents.retrieve(intent.id).status == "canceled",
            timeout=10,
            interval=0.2,
            what="the hold to lapse",
        )

        assert lapsed
        again = client.v1.payment_intents.retrieve(intent.id)
        assert again.cancellation_reason == "automatic"
        with pytest.raises(stripe.InvalidRequestError):
            client.v1.payment_intents.capture(intent.id, options={"idempotency_key": "late"})
        ledger = server.ledger()
        assert ledger["payments"] == [] and ledger["authorization_cancels"] == []
        assert ledger["authorizations"][0]["status"] == "canceled"
    finally:
        server.stop()
