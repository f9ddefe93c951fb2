"""Stripe idempotency as the real `stripe` library sees it: replay, mismatch, in flight, faults."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import requests
import stripe

from agentflow.testing.waiting import wait_for
from tests.refunds.integration.sandbox.clients import (
    intent_params,
    make_stripe_client,
    raw_create_intent,
)
from tests.support.sandbox import SandboxProcess, start_sandbox


def test_create__same_key_replays_first_response(stripe_client, clean_sandbox, new_key):
    key = new_key("charge")
    first = stripe_client.v1.payment_intents.create(
        intent_params("wf-replay"), options={"idempotency_key": key}
    )
    second = stripe_client.v1.payment_intents.create(
        intent_params("wf-replay"), options={"idempotency_key": key}
    )

    assert first.status == "succeeded" and first.latest_charge.startswith("ch_")
    assert second.id == first.id
    assert first.last_response.headers["Idempotent-Replayed"] == "false"
    assert second.last_response.headers["Idempotent-Replayed"] == "true"
    assert second.last_response.request_id.startswith("req_")
    ledger = clean_sandbox.ledger()
    assert [
        (p["id"], p["idempotency_key"], p["workflow_id"], p["amount"]) for p in ledger["payments"]
    ] == [(first.id, key, "wf-replay", 4500)]
    assert ledger["requests"]["payment_intents.create"] == 2
    assert ledger["replays"]["payment_intents.create"] == 1


def test_create__same_key_other_params_is_idempotency_error(stripe_client, clean_sandbox, new_key):
    key = new_key("charge")
    stripe_client.v1.payment_intents.create(
        intent_params(amount=4500), options={"idempotency_key": key}
    )

    with pytest.raises(stripe.IdempotencyError):
        stripe_client.v1.payment_intents.create(
            intent_params(amount=9900), options={"idempotency_key": key}
        )
    assert len(clean_sandbox.ledger()["payments"]) == 1


def test_create__same_key_while_in_flight_is_409(clean_sandbox, new_key):
    key = new_key("charge")
    clean_sandbox.set_fault(endpoint="payment_intents.create", latency_ms=1500, count=1)
    answers: list[requests.Response] = []
    first = threading.Thread(
        target=lambda: answers.append(raw_create_intent(clean_sandbox.url, key))
    )
    first.start()
    wait_for(
        lambda: clean_sandbox.ledger()["in_flight"] == 1, timeout=30, what="first request in flight"
    )

    second = raw_create_intent(clean_sandbox.url, key)
    first.join(timeout=10)

    assert second.status_code == 409
    assert second.json()["error"]["type"] == "idempotency_error"
    assert second.json()["error"]["code"] == "idempotency_key_in_use"
    assert [a.status_code for a in answers] == [200]
    assert len(clean_sandbox.ledger()["payments"]) == 1
    # Nothing was stored for the 409: the same key now replays the first request's answer.
    third = raw_create_intent(clean_sandbox.url, key)
    assert third.headers["Idempotent-Replayed"] == "true"
    assert third.json()["id"] == answers[0].json()["id"]


def test_create__parallel_clients_with_one_key_make_one_payment(clean_sandbox, new_key):
    """Library retries turn the 409s into replays: every caller gets the same intent."""
    key = new_key("charge")
    clean_sandbox.set_fault(endpoint="payment_intents.create", latency_ms=300, count=1)
    ids: list[str] = []

    def charge() -> None:
        client = make_stripe_client(clean_sandbox.url)
        ids.append(
            client.v1.payment_intents.create(intent_params(), options={"idempotency_key": key}).id
        )

    threads = [threading.Thread(target=charge) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert len(ids) == 4 and len(set(ids)) == 1
    assert [p["id"] for p in clean_sandbox.ledger()["payments"]] == ids[:1]


def test_create__decline_is_card_error_replayed_without_payment(
    stripe_client, clean_sandbox, new_key
):
    key = new_key("charge")
    params = intent_params("wf-decline", payment_method="pm_card_chargeDeclined")

    with pytest.raises(stripe.CardError) as first:
        stripe_client.v1.payment_intents.create(params, options={"idempotency_key": key})
    with pytest.raises(stripe.CardError) as second:
        stripe_client.v1.payment_intents.create(params, options={"idempotency_key": key})

    assert first.value.http_status == 402
    assert first.value.code == "card_declined"
    assert first.value.error.decline_code == "generic_decline"
    assert second.value.headers["Idempotent-Replayed"] == "true"
    ledger = clean_sandbox.ledger()
    assert ledger["payments"] == []
    assert ledger["replays"]["payment_intents.create"] == 1


def test_create__dropped_answer_is_retried_into_the_replay(stripe_client, clean_sandbox, new_key):
    clean_sandbox.set_fault(endpoint="payment_intents.create", drop_rate=1, count=1)

    intent = stripe_client.v1.payment_intents.create(
        intent_params("wf-drop"), options={"idempotency_key": new_key("charge")}
    )

    assert intent.status == "succeeded"
    assert intent.last_response.headers["Idempotent-Replayed"] == "true"
    ledger = clean_sandbox.ledger()
    assert [p["id"] for p in ledger["payments"]] == [intent.id]
    assert ledger["requests"]["payment_intents.create"] == 2


def test_create__injected_error_is_not_stored_so_the_retry_executes(
    stripe_client, clean_sandbox, new_key
):
    clean_sandbox.set_fault(endpoint="payment_intents.create", error_rate=1, count=1)

    intent = stripe_client.v1.payment_intents.create(
        intent_params("wf-500"), options={"idempotency_key": new_key("charge")}
    )

    assert intent.last_response.headers["Idempotent-Replayed"] == "false"
    ledger = clean_sandbox.ledger()
    assert [p["id"] for p in ledger["payments"]] == [intent.id]
    assert ledger["requests"]["payment_intents.create"] == 2
    assert clean_sandbox.set_fault(unknown_bookings=["ZZZ999"])["faults"] == {}  # disarmed


def test_create__injected_error_surfaces_when_retries_run_out(clean_sandbox, new_key):
    clean_sandbox.set_fault(endpoint="payment_intents.create", error_rate=1, error_status=503)
    client = make_stripe_client(clean_sandbox.url, max_network_retries=0)

    with pytest.raises(stripe.APIError) as raised:
        client.v1.payment_intents.create(intent_params(), options={"idempotency_key": new_key("c")})

    assert raised.value.http_status == 503
    assert clean_sandbox.ledger()["payments"] == []


def test_create__without_key_executes_every_time(clean_sandbox):
    answers = [raw_create_intent(clean_sandbox.url, None) for _ in range(2)]

    assert [a.status_code for a in answers] == [200, 200]
    assert "Idempotent-Replayed" not in answers[0].headers
    assert len(clean_sandbox.ledger()["payments"]) == 2


def test_create__invalid_params_are_not_stored_for_the_key(clean_sandbox, new_key):
    key = new_key("charge")

    rejected = raw_create_intent(clean_sandbox.url, key, amount="0")
    accepted = raw_create_intent(clean_sandbox.url, key, amount="4500")

    assert rejected.status_code == 400
    assert rejected.json()["error"]["type"] == "invalid_request_error"
    assert accepted.status_code == 200
    assert accepted.headers["Idempotent-Replayed"] == "false"


def test_create__without_a_test_key_is_authentication_error(clean_sandbox):
    client = stripe.StripeClient("sk_live_nope", base_addresses={"api": clean_sandbox.url})

    with pytest.raises(stripe.AuthenticationError):
        client.v1.payment_intents.create(intent_params())
    assert clean_sandbox.ledger()["payments"] == []


def test_key_window__an_expired_key_executes_again(tmp_path: Path):
    server: SandboxProcess = start_sandbox(tmp_path, key_window_seconds=1)
    try:
        client = make_stripe_client(server.url)
        first = client.v1.payment_intents.create(
            intent_params(), options={"idempotency_key": "old"}
        )

        def executed_again():
            intent = client.v1.payment_intents.create(
                intent_params(), options={"idempotency_key": "old"}
            )
            return (
                intent if intent.last_response.headers["Idempotent-Replayed"] == "false" else None
            )

        # Same key, same params: replayed until the window passes, then executed as new.
        again = wait_for(executed_again, timeout=10, interval=0.2, what="the key to expire")

        assert again.id != first.id
        assert [p["idempotency_key"] for p in server.ledger()["payments"]] == ["old", "old"]
    finally:
        server.stop()
