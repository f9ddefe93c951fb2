"""Stripe's manual capture: a payment intent created with `capture_method=manual` holds the
amount on the card (`requires_capture`) until it is captured (the money is taken) or cancelled
(the hold is released). An uncaptured hold lapses after seven days, as Stripe's card holds do.

The hold itself is made by `payment_intents.create` (stripe_api); its effect, `authorization`,
keeps the live intent as its body. A capture and a cancel are effects of their own (`capture`,
`authorization_cancel`), each under its request's key, about the intent.
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

from refunds.sandbox.idempotency import Effect
from refunds.sandbox.messages import Invalid, Request, Response, stripe_error
from refunds.sandbox.state import Store, add_effect
from refunds.sandbox.stripe_api import form, injected

#: Stripe cancels an uncaptured card payment after seven days.
AUTHORIZATION_SECONDS = 7 * 24 * 3600
CAPTURE_PARAMS = frozenset({"amount_to_capture", "expand"})
CANCEL_PARAMS = frozenset({"cancellation_reason", "expand"})
CANCELLATION_REASONS = frozenset({"duplicate", "fraudulent", "requested_by_customer", "abandoned"})
#: Statuses from which Stripe lets an intent be cancelled.
CANCELLABLE = (
    "requires_payment_method",
    "requires_capture",
    "requires_confirmation",
    "requires_action",
    "processing",
)


def expire(store: Store, *, after_seconds: float) -> None:
    """Lapse every hold older than `after_seconds` (Stripe: 7 days), before any read of it."""
    stale = (
        "SELECT id, body FROM effects WHERE kind = 'authorization' AND created < ?"
        " AND json_extract(body, '$.status') = 'requires_capture'"
    )
    cutoff = time.time() - after_seconds
    if not store.select(stale, (cutoff,)):
        return  # the usual case: no write lock taken on every Stripe request
    with store.transaction() as db:
        for row in db.execute(stale, (cutoff,)).fetchall():
            _save(db, _cancelled(json.loads(row["body"]), "automatic"))


def capture(intent_id: str) -> Effect:
    """`POST /v1/payment_intents/{id}/capture`: take the whole held amount."""

    def parse(request: Request) -> dict[str, Any]:
        params = form(request, CAPTURE_PARAMS)
        return {**params, "intent": intent_id}

    def execute(db: sqlite3.Connection, params: dict[str, Any], key: str | None) -> Response:
        intent = _intent(db, intent_id)
        if intent is None:
            return _missing(intent_id)
        if intent["status"] != "requires_capture":
            return _unexpected_state(intent, "captured", ("requires_capture",))
        wanted = params.get("amount_to_capture")
        if wanted is not None and wanted != str(intent["amount_capturable"]):
            return stripe_error(
                400,
                "invalid_request_error",
                "The sandbox captures the whole held amount only.",
                param="amount_to_capture",
            )
        taken = {
            **intent,
            "amount_capturable": 0,
            "amount_received": intent["amount"],
            "status": "succeeded",
        }
        _save(db, taken)
        add_effect(
            db,
            kind="capture",
            id=intent["latest_charge"],
            idempotency_key=key,
            workflow_id=intent["metadata"].get("workflow_id"),
            amount=intent["amount"],
            subject=intent_id,
            body=taken,
        )
        return Response(status=200, body=taken)

    return _effect("payment_intents.capture", parse, execute)


def cancel(intent_id: str) -> Effect:
    """`POST /v1/payment_intents/{id}/cancel`: release the hold; nothing is ever taken."""

    def parse(request: Request) -> dict[str, Any]:
        params = form(request, CANCEL_PARAMS)
        reason = params.get("cancellation_reason")
        if reason is not None and reason not in CANCELLATION_REASONS:
            raise Invalid(
                stripe_error(
                    400,
                    "invalid_request_error",
                    "Invalid cancellation_reason",
                    param="cancellation_reason",
                )
            )
        return {**params, "intent": intent_id}

    def execute(db: sqlite3.Connection, params: dict[str, Any], key: str | None) -> Response:
        intent = _intent(db, intent_id)
        if intent is None:
            return _missing(intent_id)
        if intent["status"] not in CANCELLABLE:
            return _unexpected_state(intent, "canceled", CANCELLABLE)
        released = _cancelled(intent, params.get("cancellation_reason"))
        _save(db, released)
        add_effect(
            db,
            kind="authorization_cancel",
            id=f"{intent_id}_cancel",  # an intent is cancelled at most once
            idempotency_key=key,
            workflow_id=intent["metadata"].get("workflow_id"),
            amount=intent["amount"],
            subject=intent_id,
            body=released,
        )
        return Response(status=200, body=released)

    return _effect("payment_intents.cancel", parse, execute)


def _effect(name: str, parse: Any, execute: Any) -> Effect:
    return Effect(
        name=name,
        scope="stripe",
        key_required=False,
        parse=parse,
        execute=execute,
        injected=injected,
    )


def _intent(db: sqlite3.Connection, intent_id: str) -> dict[str, Any] | None:
    row = db.execute(
        "SELECT body FROM effects WHERE kind = 'authorization' AND id = ?", (intent_id,)
    ).fetchone()
    if row is not None:
        return json.loads(row["body"])
    row = db.execute(
        "SELECT body FROM effects WHERE kind = 'payment' AND id = ?", (intent_id,)
    ).fetchone()
    return json.loads(row["body"]) if row is not None else None


def _save(db: sqlite3.Connection, intent: dict[str, Any]) -> None:
    """The hold's new state: what a retrieve answers from now on."""
    db.execute(
        "UPDATE effects SET body = ? WHERE kind = 'authorization' AND id = ?",
        (json.dumps(intent), intent["id"]),
    )


def _cancelled(intent: dict[str, Any], reason: str | None) -> dict[str, Any]:
    return {
        **intent,
        "amount_capturable": 0,
        "canceled_at": int(time.time()),
        "cancellation_reason": reason,
        "status": "canceled",
    }


def _missing(intent_id: str) -> Response:
    return stripe_error(
        404,
        "invalid_request_error",
        f"No such payment_intent: '{intent_id}'",
        code="resource_missing",
        param="intent",
    )


def _unexpected_state(intent: dict[str, Any], verb: str, allowed: tuple[str, ...]) -> Response:
    return stripe_error(
        400,
        "invalid_request_error",
        f"This PaymentIntent could not be {verb} because it has a status of {intent['status']}. "
        f"Only a PaymentIntent with one of the following statuses may be {verb}: "
        f"{', '.join(allowed)}.",
        code="payment_intent_unexpected_state",
        payment_intent=intent,
    )
