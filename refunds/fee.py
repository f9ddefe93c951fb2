"""The change fee's money, for both engines: held on the card before the seat is touched, taken
once the new boarding pass is issued, and given back when the change fails — the hold released
(nothing ever reaches the statement) or, once taken, refunded.

Each function returns the small JSON dict its step records; the status page and the e-mails
read these (`authorized`, `captured`, `refunded`, `hold_released`), never a step's name.
"""

from __future__ import annotations

from typing import Any

from agentflow import durable
from agentflow.durable import PermanentStepError
from refunds.gateways import Payment, PaymentGateway, Refund

#: A hold that exists: still held, or taken by its capture.
HELD_STATUSES = ("requires_capture", "succeeded")
NO_FEE: dict[str, Any] = {"authorized": False, "amount_cents": 0}
NOT_TAKEN: dict[str, Any] = {"captured": False, "amount_cents": 0}
NOTHING_TO_GIVE_BACK: dict[str, Any] = {
    "refunded": False,
    "hold_released": False,
    "amount_cents": 0,
}


def hold(
    *,
    amount_cents: int,
    currency: str,
    payment_method: str,
    reference: str,
    refund_id: str,
    key: str,
    workflow_id: str,
) -> dict[str, Any]:
    """Hold the fee on the card under `key` (nothing for a free change); refused readably when
    the card is declined or the bank wants more than a card."""
    if amount_cents <= 0:
        return dict(NO_FEE)
    payment = PaymentGateway.from_settings().authorize(
        amount_cents=amount_cents,
        currency=currency,
        payment_method=payment_method,
        description=f"Change fee for booking {reference}",
        key=key,
        workflow_id=workflow_id,
        metadata={"refund_id": refund_id, "booking_reference": reference},
    )
    if payment.status == "requires_action":
        raise PermanentStepError(
            "Your bank asked for an extra check on this payment, which we can't do by email. "
            "You have not been charged."
        )
    if payment.status not in HELD_STATUSES:
        raise PermanentStepError(f"Your payment did not go through ({payment.status}).")
    return _held(payment)


def find_hold(key: str) -> dict[str, Any] | None:
    """The hold made under `key`, as `hold` would have returned it; None when it exists but
    holds nothing (declined, needs action, released). Raises OutcomeUnknown when Stripe's
    search shows none: it can lag a fresh payment by a minute, so that is no proof."""
    payment = PaymentGateway.from_settings().find_payment_by_key(key)
    if payment is None:
        raise durable.OutcomeUnknown(
            "Stripe's search shows no payment under this key yet (it can lag a minute)"
        )
    return _held(payment) if payment.status in HELD_STATUSES else None


def capture(held: dict[str, Any], *, key: str) -> dict[str, Any]:
    """Take the held fee (the change is made). A hold that lapsed is `HoldLapsed`: nothing is
    taken, and the run fails with a reason the customer can read."""
    if not held.get("authorized"):
        return dict(NOT_TAKEN)
    payment = PaymentGateway.from_settings().capture(
        payment_intent_id=held["payment_intent_id"], key=key
    )
    return _captured(payment)


def find_capture(held: dict[str, Any]) -> dict[str, Any] | None:
    """Reconcile for the capture: Stripe's payment as it is now (a consistent read), so a
    takeover days later, past the key window or the hold's 7 days, never captures blindly."""
    if not held.get("authorized"):
        return dict(NOT_TAKEN)
    payment = PaymentGateway.from_settings().payment(held["payment_intent_id"])
    return _captured(payment) if payment.status == "succeeded" else None


def give_back(held: dict[str, Any], *, key: str, workflow_id: str) -> dict[str, Any]:
    """Undo the hold after a later failure, as the payment stands at Stripe: a fee already taken
    is refunded in full; one still held is released (or had lapsed): no money moved."""
    if not held.get("authorized"):
        return dict(NOTHING_TO_GIVE_BACK)
    gateway = PaymentGateway.from_settings()
    intent = held["payment_intent_id"]
    if gateway.payment(intent).status == "succeeded":
        refund = gateway.refund(
            payment_intent_id=intent,
            amount_cents=held["amount_cents"],
            key=key,
            workflow_id=workflow_id,
        )
        return _refunded(refund, held)
    gateway.cancel_authorization(payment_intent_id=intent, key=key)
    return _released(held)


def find_given_back(held: dict[str, Any], *, key: str) -> dict[str, Any] | None:
    """Reconcile for `give_back`: the refund made under `key` (Stripe's refund list is
    consistent), or the hold already gone; None when neither happened yet."""
    if not held.get("authorized"):
        return dict(NOTHING_TO_GIVE_BACK)
    gateway = PaymentGateway.from_settings()
    intent = held["payment_intent_id"]
    status = gateway.payment(intent).status
    if status == "canceled":
        return _released(held)
    if status != "succeeded":
        return None
    refund = gateway.find_refund_by_key(payment_intent_id=intent, key=key)
    return _refunded(refund, held) if refund is not None else None


def _held(payment: Payment) -> dict[str, Any]:
    return {
        "authorized": True,
        "payment_intent_id": payment.id,
        "amount_cents": payment.amount_cents,
        "currency": payment.currency,
        "status": payment.status,
    }


def _captured(payment: Payment) -> dict[str, Any]:
    return {
        "captured": True,
        "payment_intent_id": payment.id,
        "amount_cents": payment.amount_cents,
        "currency": payment.currency,
    }


def _refunded(refund: Refund, held: dict[str, Any]) -> dict[str, Any]:
    return {
        "refunded": True,
        "hold_released": False,
        "refund_id": refund.id,
        "amount_cents": refund.amount_cents,
        "currency": held["currency"],
    }


def _released(held: dict[str, Any]) -> dict[str, Any]:
    return {
        "refunded": False,
        "hold_released": True,
        "amount_cents": held["amount_cents"],
        "currency": held["currency"],
    }
