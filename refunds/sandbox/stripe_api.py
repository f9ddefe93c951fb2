"""The Stripe subset: payment intents (create with confirm, retrieve, search) and refunds;
manual capture (capture, cancel, a hold's lapse) is in stripe_holds.

Bodies are form-encoded with Stripe's bracket syntax; answers and errors are shaped like Stripe's
so the real `stripe` library parses them into its own objects and exceptions.
"""

from __future__ import annotations

import json
import re
import secrets
import sqlite3
import time
from typing import Any

from refunds.sandbox.idempotency import Effect
from refunds.sandbox.messages import Invalid, Request, Response, stripe_error
from refunds.sandbox.state import Store, add_effect
from refunds.sandbox.stripe_syntax import decode_form, parse_query

# Stripe's test payment methods that decline, with the decline code and message Stripe gives.
DECLINES = {
    "pm_card_chargeDeclined": ("generic_decline", "Your card was declined."),
    "pm_card_chargeDeclinedInsufficientFunds": (
        "insufficient_funds",
        "Your card has insufficient funds.",
    ),
    "pm_card_chargeDeclinedExpiredCard": ("expired_card", "Your card has expired."),
    "pm_card_chargeDeclinedStolenCard": ("stolen_card", "Your card was declined."),
    "pm_card_chargeDeclinedLostCard": ("lost_card", "Your card was declined."),
    "pm_card_chargeDeclinedFraudulent": ("fraudulent", "Your card was declined."),
}
INTENT_PARAMS = frozenset(
    {
        "amount",
        "currency",
        "payment_method",
        "confirm",
        "description",
        "metadata",
        "expand",
        "automatic_payment_methods",
        "payment_method_types",
        "return_url",
        "off_session",
        "receipt_email",
        "statement_descriptor",
        "statement_descriptor_suffix",
        "customer",
        "capture_method",
    }
)
REFUND_PARAMS = frozenset({"payment_intent", "amount", "metadata", "reason", "expand"})
REFUND_REASONS = frozenset({"duplicate", "fraudulent", "requested_by_customer"})
#: Effect kinds whose body is a payment intent: charged at once, or held for a later capture.
INTENT_KINDS = ("payment", "authorization")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def check_auth(request: Request) -> Response | None:
    """A 401 unless the request carries a test key: `Authorization: Bearer sk_test_...`."""
    auth = request.header("Authorization") or ""
    if auth.startswith("Bearer sk_test_") or auth.startswith("Bearer rk_test_"):
        return None
    return stripe_error(
        401,
        "authentication_error",
        "Invalid API Key provided: send a test secret key as 'Authorization: Bearer sk_test_...'.",
    )


def injected(status: int) -> Response:
    return stripe_error(status, "api_error", f"Injected sandbox fault ({status}).")


def form(request: Request, allowed: frozenset[str]) -> dict[str, Any]:
    try:
        params = decode_form(request.body.decode("utf-8", "replace"))
    except ValueError as exc:
        raise Invalid(stripe_error(400, "invalid_request_error", str(exc))) from None
    for name in params:
        if name not in allowed:
            raise Invalid(
                stripe_error(
                    400, "invalid_request_error", f"Received unknown parameter: {name}", param=name
                )
            )
    metadata = params.get("metadata", {})
    if not isinstance(metadata, dict):
        raise Invalid(
            stripe_error(400, "invalid_request_error", "metadata must be a hash", param="metadata")
        )
    return params


def _amount(params: dict[str, Any], *, required: bool) -> int | None:
    raw = params.get("amount")
    if raw is None:
        if required:
            raise Invalid(
                stripe_error(
                    400,
                    "invalid_request_error",
                    "Missing required param: amount.",
                    code="parameter_missing",
                    param="amount",
                )
            )
        return None
    if not (isinstance(raw, str) and raw.isdigit() and int(raw) > 0):
        raise Invalid(
            stripe_error(
                400,
                "invalid_request_error",
                "Invalid positive integer",
                code="parameter_invalid_integer",
                param="amount",
            )
        )
    return int(raw)


def _required(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not value:
        raise Invalid(
            stripe_error(
                400,
                "invalid_request_error",
                f"Missing required param: {name}.",
                code="parameter_missing",
                param=name,
            )
        )
    return value


# --- payment intents -------------------------------------------------------------------------


def _parse_intent(request: Request) -> dict[str, Any]:
    params = form(request, INTENT_PARAMS)
    _amount(params, required=True)
    if not re.fullmatch(r"[A-Za-z]{3}", _required(params, "currency")):
        raise Invalid(
            stripe_error(400, "invalid_request_error", "Invalid currency", param="currency")
        )
    _required(params, "payment_method")
    if params.get("confirm") != "true":
        raise Invalid(
            stripe_error(
                400,
                "invalid_request_error",
                "The sandbox only supports confirm=true.",
                param="confirm",
            )
        )
    if params.get("capture_method", "automatic") not in ("automatic", "manual"):
        raise Invalid(
            stripe_error(
                400, "invalid_request_error", "Invalid capture_method", param="capture_method"
            )
        )
    return params


def _create_intent(db: sqlite3.Connection, params: dict[str, Any], key: str | None) -> Response:
    payment_method = params["payment_method"]
    if payment_method in DECLINES:
        decline_code, message = DECLINES[payment_method]
        return stripe_error(
            402,
            "card_error",
            message,
            code="card_declined",
            decline_code=decline_code,
            charge=new_id("ch"),
        )
    intent_id = new_id("pi")
    amount = int(params["amount"])
    metadata = params.get("metadata", {})
    manual = params.get("capture_method") == "manual"
    intent = {
        "id": intent_id,
        "object": "payment_intent",
        "amount": amount,
        "amount_capturable": amount if manual else 0,
        "amount_received": 0 if manual else amount,
        "capture_method": "manual" if manual else "automatic",
        "client_secret": f"{intent_id}_secret_{secrets.token_hex(8)}",
        "confirmation_method": "automatic",
        "created": int(time.time()),
        "currency": params["currency"].lower(),
        "description": params.get("description"),
        "latest_charge": new_id("ch"),
        "livemode": False,
        "metadata": metadata,
        "payment_method": payment_method,
        "payment_method_types": ["card"],
        "status": "requires_capture" if manual else "succeeded",
    }
    add_effect(
        db,
        # A hold is its own kind: the ledger's `payments` are money taken (stripe_holds).
        kind="authorization" if manual else "payment",
        id=intent_id,
        idempotency_key=key,
        workflow_id=metadata.get("workflow_id"),
        amount=amount,
        body=intent,
    )
    return Response(status=200, body=intent)


CREATE_INTENT = Effect(
    name="payment_intents.create",
    scope="stripe",
    key_required=False,
    parse=_parse_intent,
    execute=_create_intent,
    injected=injected,
)


def retrieve_intent(store: Store, intent_id: str) -> Response:
    rows = store.select(
        "SELECT body FROM effects WHERE kind IN (?, ?) AND id = ?", (*INTENT_KINDS, intent_id)
    )
    if not rows:
        return stripe_error(
            404,
            "invalid_request_error",
            f"No such payment_intent: '{intent_id}'",
            code="resource_missing",
            param="intent",
        )
    return Response(status=200, body=json.loads(rows[0]["body"]))


def search_intents(store: Store, request: Request) -> Response:
    """Stripe's search syntax for `metadata['k']:'v'`, status, currency, amount, joined by AND."""
    query = request.query.get("query", "").strip()
    if not query:
        return stripe_error(
            400, "invalid_request_error", "Missing required param: query.", param="query"
        )
    limit = request.query.get("limit", "10")
    if not (limit.isdigit() and 1 <= int(limit) <= 100):
        return stripe_error(400, "invalid_request_error", "limit must be 1..100", param="limit")
    try:
        clauses = parse_query(query)
    except ValueError as exc:
        return stripe_error(
            400, "invalid_request_error", f"The sandbox cannot search by: {exc}", param="query"
        )
    found = []
    rows = store.select(
        "SELECT body FROM effects WHERE kind IN (?, ?) ORDER BY seq DESC", INTENT_KINDS
    )
    for row in rows:
        intent = json.loads(row["body"])
        if all(_matches(intent, mkey, field, value) for mkey, field, value in clauses):
            found.append(intent)
    data = found[: int(limit)]
    body = {
        "object": "search_result",
        "data": data,
        "has_more": len(found) > len(data),
        "next_page": None,
        "url": "/v1/payment_intents/search",
    }
    return Response(status=200, body=body)


def _matches(intent: dict[str, Any], mkey: str | None, field: str | None, value: str) -> bool:
    if mkey is not None:
        return intent["metadata"].get(mkey) == value
    return str(intent.get(field or "")) == value


# --- refunds ---------------------------------------------------------------------------------


def _parse_refund(request: Request) -> dict[str, Any]:
    params = form(request, REFUND_PARAMS)
    _required(params, "payment_intent")
    _amount(params, required=False)
    if "reason" in params and params["reason"] not in REFUND_REASONS:
        raise Invalid(stripe_error(400, "invalid_request_error", "Invalid reason", param="reason"))
    return params


def _create_refund(db: sqlite3.Connection, params: dict[str, Any], key: str | None) -> Response:
    intent_id = params["payment_intent"]
    row = db.execute(
        "SELECT body FROM effects WHERE kind IN (?, ?) AND id = ?", (*INTENT_KINDS, intent_id)
    ).fetchone()
    if row is None:
        return stripe_error(
            400,
            "invalid_request_error",
            f"No such payment_intent: '{intent_id}'",
            code="resource_missing",
            param="payment_intent",
        )
    intent = json.loads(row["body"])
    if intent["status"] != "succeeded":
        return stripe_error(
            400,
            "invalid_request_error",
            f"This PaymentIntent ({intent_id}) does not have a successful charge to refund "
            f"(status {intent['status']}); cancel an uncaptured PaymentIntent instead.",
            code="charge_not_refundable",
        )
    refunded = db.execute(
        "SELECT COALESCE(SUM(amount), 0) FROM effects WHERE kind = 'refund' AND subject = ?",
        (intent_id,),
    ).fetchone()[0]
    remaining = intent["amount"] - refunded
    amount = int(params["amount"]) if "amount" in params else remaining
    if remaining <= 0:
        return stripe_error(
            400,
            "invalid_request_error",
            f"Charge {intent['latest_charge']} has already been refunded.",
            code="charge_already_refunded",
        )
    if amount > remaining:
        return stripe_error(
            400,
            "invalid_request_error",
            f"Refund amount ({amount}) is greater than unrefunded amount on charge ({remaining})",
            code="amount_too_large",
            param="amount",
        )
    metadata = params.get("metadata", {})
    refund = {
        "id": new_id("re"),
        "object": "refund",
        "amount": amount,
        "charge": intent["latest_charge"],
        "created": int(time.time()),
        "currency": intent["currency"],
        "metadata": metadata,
        "payment_intent": intent_id,
        "reason": params.get("reason"),
        "status": "succeeded",
    }
    add_effect(
        db,
        kind="refund",
        id=refund["id"],
        idempotency_key=key,
        workflow_id=metadata.get("workflow_id"),
        amount=amount,
        subject=intent_id,
        body=refund,
    )
    return Response(status=200, body=refund)


CREATE_REFUND = Effect(
    name="refunds.create",
    scope="stripe",
    key_required=False,
    parse=_parse_refund,
    execute=_create_refund,
    injected=injected,
)
