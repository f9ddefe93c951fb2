"""Payment intents retrieve and search, and refunds, through the real `stripe` library."""

from __future__ import annotations

import pytest
import stripe

from tests.refunds.integration.sandbox.clients import intent_params


def _charge(client, workflow_id: str, key: str, **metadata: str):
    params = intent_params(workflow_id)
    params["metadata"].update(metadata)
    return client.v1.payment_intents.create(params, options={"idempotency_key": key})


def test_retrieve__returns_the_intent_or_resource_missing(stripe_client):
    intent = _charge(stripe_client, "wf-get", "get-1")

    fetched = stripe_client.v1.payment_intents.retrieve(intent.id)

    assert (fetched.id, fetched.amount, fetched.currency, fetched.livemode) == (
        intent.id,
        4500,
        "usd",
        False,
    )
    assert fetched.metadata["workflow_id"] == "wf-get"
    with pytest.raises(stripe.InvalidRequestError) as raised:
        stripe_client.v1.payment_intents.retrieve("pi_missing")
    assert raised.value.http_status == 404 and raised.value.code == "resource_missing"


def test_search__by_metadata_finds_only_that_workflows_intents(stripe_client):
    mine = [_charge(stripe_client, "wf-a", f"a-{n}", step="charge_customer") for n in range(2)]
    _charge(stripe_client, "wf-b", "b-1", step="charge_customer")

    found = stripe_client.v1.payment_intents.search({"query": "metadata['workflow_id']:'wf-a'"})
    both = stripe_client.v1.payment_intents.search(
        {"query": "metadata['workflow_id']:'wf-a' AND metadata['step']:'charge_customer'"}
    )
    none = stripe_client.v1.payment_intents.search({"query": "metadata['workflow_id']:'wf-zzz'"})

    assert found.object == "search_result" and found.has_more is False
    assert sorted(i.id for i in found.data) == sorted(i.id for i in mine)
    assert sorted(i.id for i in both.data) == sorted(i.id for i in mine)
    assert none.data == []


def test_search__unsupported_query_is_invalid_request(stripe_client):
    with pytest.raises(stripe.InvalidRequestError):
        stripe_client.v1.payment_intents.search({"query": "customer:'cus_1' OR x"})


def test_refund__partial_then_rest_then_nothing_left(stripe_client, clean_sandbox):
    intent = _charge(stripe_client, "wf-refund", "charge-r")
    meta = {"workflow_id": "wf-refund"}

    part = stripe_client.v1.refunds.create(
        {"payment_intent": intent.id, "amount": 1000, "metadata": meta},
        options={"idempotency_key": "refund-1"},
    )
    rest = stripe_client.v1.refunds.create(
        {"payment_intent": intent.id, "metadata": meta}, options={"idempotency_key": "refund-2"}
    )
    with pytest.raises(stripe.InvalidRequestError) as raised:
        stripe_client.v1.refunds.create(
            {"payment_intent": intent.id, "amount": 1}, options={"idempotency_key": "refund-3"}
        )

    assert (part.object, part.status, part.amount, part.payment_intent) == (
        "refund",
        "succeeded",
        1000,
        intent.id,
    )
    assert rest.amount == 3500
    assert raised.value.http_status == 400
    refunds = clean_sandbox.ledger(workflow_id="wf-refund")["refunds"]
    assert [(r["id"], r["idempotency_key"], r["amount"]) for r in refunds] == [
        (part.id, "refund-1", 1000),
        (rest.id, "refund-2", 3500),
    ]


def test_refund__same_key_replays_and_unknown_intent_is_invalid(stripe_client, clean_sandbox):
    intent = _charge(stripe_client, "wf-r2", "charge-r2")
    params = {"payment_intent": intent.id, "metadata": {"workflow_id": "wf-r2"}}

    first = stripe_client.v1.refunds.create(params, options={"idempotency_key": "comp-1"})
    again = stripe_client.v1.refunds.create(params, options={"idempotency_key": "comp-1"})
    with pytest.raises(stripe.InvalidRequestError):
        stripe_client.v1.refunds.create(
            {"payment_intent": "pi_nope"}, options={"idempotency_key": "x"}
        )

    assert again.id == first.id
    assert again.last_response.headers["Idempotent-Replayed"] == "true"
    assert len(clean_sandbox.ledger()["refunds"]) == 1
