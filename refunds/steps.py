"""The refund workflow's steps: one side effect each, carrying the step's idempotency key.

Outputs are small JSON dicts holding what later steps and the status page need (ids, seat,
amounts). The customer's words and the address they typed stay in their RefundRequest row;
mail goes to the booking's contact e-mail on file (in `fetch_booking`'s output), and only once
`fetch_booking` has found the request to come from the booking's owner.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from django.template.loader import render_to_string

from agentflow import durable
from agentflow.durable import PermanentStepError, StepContext
from refunds import ownership, policy, progress
from refunds.gateways import (
    AirlineGateway,
    BookingNotFound,
    CrmGateway,
    Mailer,
    Payment,
    PaymentGateway,
    Refund,
    SeatCancellation,
)
from refunds.models import RefundRequest
from refunds.parsing import parse_request

#: Payment intent states in which the money is (or will be) taken.
CHARGED_STATUSES = ("succeeded", "processing", "requires_capture")


# --- reads ----------------------------------------------------------------------------------
def load_request(ctx: StepContext) -> dict[str, Any]:
    request = request_of(ctx)
    return {
        "refund_id": request.public_id,
        "booking_reference": request.booking_reference.strip().upper(),
        "submitted_on": request.created_at.date().isoformat(),
    }


def parse_flight_details(ctx: StepContext) -> dict[str, Any]:
    request = request_of(ctx)
    # Anchored on the submission date, so a retry next week reads "tomorrow" the same way.
    parsed = parse_request(
        request.message, request.booking_reference, today=request.created_at.date()
    )
    return parsed.as_dict()


def fetch_booking(ctx: StepContext) -> dict[str, Any]:
    """The booking, once the request is found to come from its owner (refunds.ownership).

    Before any effect, and in the same step as the lookup so that nothing of someone else's
    booking is ever checkpointed. An unknown reference fails exactly like a wrong name or
    e-mail, so the form cannot be used to learn which references exist.
    """
    request = request_of(ctx)
    try:
        booking = AirlineGateway.from_settings().booking(_reference(ctx))
    except BookingNotFound:
        raise PermanentStepError(ownership.MISMATCH) from None
    if not ownership.is_owner(
        last_name=request.last_name,
        email=request.email,
        passenger_last_name=booking.passenger_last_name,
        contact_email=booking.contact_email,
    ):
        raise PermanentStepError(ownership.MISMATCH)
    return asdict(booking)


def check_cancellation_policy(ctx: StepContext) -> dict[str, Any]:
    rules = policy.policy_for(ctx.output_of("fetch_booking")["fare_class"])
    if not rules.rebookable:
        raise PermanentStepError(rules.refusal)
    return {"fare_class": rules.fare_class, "rebookable": True, "fee_cents": rules.fee_cents}


def calculate_penalty_fee(ctx: StepContext) -> dict[str, Any]:
    return policy.calculate_penalty_fee(ctx.output_of("fetch_booking")["fare_class"])


# --- effects --------------------------------------------------------------------------------
def cancel_seat(ctx: StepContext) -> dict[str, Any]:
    released = AirlineGateway.from_settings().cancel_seat(
        _reference(ctx), key=ctx.idempotency_key, workflow_id=ctx.run_id
    )
    return _cancellation_output(released)


def find_seat_cancellation(ctx: StepContext) -> dict[str, Any] | None:
    """Reconcile for `cancel_seat`: the airline's cancellation under this step's key, or None
    when it has none (its lookup is consistent, so that proves the seat was not released)."""
    found = AirlineGateway.from_settings().find_seat_cancellation(key=ctx.idempotency_key)
    return _cancellation_output(found) if found is not None else None


def _cancellation_output(released: SeatCancellation) -> dict[str, Any]:
    return {
        "cancellation_id": released.cancellation_id,
        "seat": released.seat,
        "status": released.status,
    }


def charge_customer(ctx: StepContext) -> dict[str, Any]:
    """Charge the change fee. Every parameter comes from earlier checkpoints, so a retry sends
    exactly the same request under the same key and Stripe replays instead of charging again."""
    fee = ctx.output_of("calculate_penalty_fee")
    return take_fee(
        amount_cents=fee["amount_cents"],
        currency=fee["currency"],
        payment_method=ctx.output_of("fetch_booking")["payment_method"],
        reference=_reference(ctx),
        refund_id=ctx.input["refund_id"],
        key=ctx.idempotency_key,
        workflow_id=ctx.run_id,
    )


def take_fee(
    *,
    amount_cents: int,
    currency: str,
    payment_method: str,
    reference: str,
    refund_id: str,
    key: str,
    workflow_id: str,
) -> dict[str, Any]:
    """The fee charge both engines make: nothing for a free change, else one payment under
    `key`, refused readably when the bank wants more than a card."""
    if amount_cents <= 0:
        return {"charged": False, "amount_cents": 0}
    payment = PaymentGateway.from_settings().charge(
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
    if payment.status not in CHARGED_STATUSES:
        raise PermanentStepError(f"Your payment did not go through ({payment.status}).")
    return _charge_output(payment)


def find_fee_payment(ctx: StepContext) -> dict[str, Any] | None:
    """Reconcile for `charge_customer` (SPEC §3.3a): the payment made under this step's key.

    Finding none proves nothing: Stripe's search index can lag a fresh payment by up to a
    minute, so "not found" is `OutcomeUnknown`. Inside Stripe's 24-hour key window the engine
    then retries under the same key (Stripe replays a payment that exists); after the retries,
    or past the window, it parks the run for an operator rather than guess with money.
    """
    fee = ctx.output_of("calculate_penalty_fee")
    if not fee or fee["amount_cents"] <= 0:
        return None  # nothing is ever sent for a free change: running the step again is safe
    return find_fee(ctx.idempotency_key)


def find_fee(key: str) -> dict[str, Any] | None:
    """The fee payment made under `key`, as `take_fee` would have returned it; None when it
    exists but took no money (declined, needs action). Raises OutcomeUnknown when Stripe's
    search shows none: it can lag a fresh payment by a minute, so that is no proof."""
    payment = PaymentGateway.from_settings().find_payment_by_key(key)
    if payment is None:
        raise durable.OutcomeUnknown(
            "Stripe's search shows no payment under this key yet (it can lag a minute)"
        )
    if payment.status not in CHARGED_STATUSES:
        return None  # it exists but took no money: nothing to keep
    return _charge_output(payment)


def _charge_output(payment: Payment) -> dict[str, Any]:
    return {
        "charged": True,
        "payment_intent_id": payment.id,
        "amount_cents": payment.amount_cents,
        "currency": payment.currency,
        "status": payment.status,
    }


def issue_boarding_pass(ctx: StepContext) -> dict[str, Any]:
    flight, date = _new_flight(ctx)
    issued = AirlineGateway.from_settings().issue_boarding_pass(
        _reference(ctx), flight=flight, date=date, key=ctx.idempotency_key, workflow_id=ctx.run_id
    )
    return asdict(issued)


def find_boarding_pass(ctx: StepContext) -> dict[str, Any] | None:
    """Reconcile for `issue_boarding_pass`: the pass issued under this step's key, or None
    (a consistent lookup: none was issued)."""
    found = AirlineGateway.from_settings().find_boarding_pass(key=ctx.idempotency_key)
    return asdict(found) if found is not None else None


def update_crm(ctx: StepContext) -> dict[str, Any]:
    issued = ctx.output_of("issue_boarding_pass")
    charge = ctx.output_of("charge_customer")
    fee = _fee_text(charge)
    note = (
        f"Rebooked onto {issued['flight']} on {issued['date']}, seat {issued['seat']} "
        f"(boarding pass {issued['boarding_pass_id']}). Fee: {fee}. "
        f"Customer asked: {ctx.output_of('parse_flight_details')['summary']}."
    )
    update_id = CrmGateway.from_settings().update(
        customer_email=ctx.output_of("fetch_booking")["contact_email"],
        reference=_reference(ctx),
        note=note,
        key=ctx.idempotency_key,
        workflow_id=ctx.run_id,
    )
    return {"update_id": update_id}


def find_crm_update(ctx: StepContext) -> dict[str, Any] | None:
    """Reconcile for `update_crm`: the note recorded under this step's key, or None."""
    update_id = CrmGateway.from_settings().find_update(key=ctx.idempotency_key)
    return {"update_id": update_id} if update_id is not None else None


def send_confirmation_email(ctx: StepContext) -> dict[str, Any]:
    booking = ctx.output_of("fetch_booking")
    issued = ctx.output_of("issue_boarding_pass")
    charge = ctx.output_of("charge_customer")
    context = {
        **issued,
        "reference": _reference(ctx),
        "passenger_name": booking["passenger_name"],
        "origin": booking["origin"],
        "destination": booking["destination"],
        "fare_class": booking["fare_class"],
        "date_words": progress.date_in_words(issued["date"]),
        "old_flight": booking["flight"],
        "old_date_words": progress.date_in_words(booking["date"]),
        "old_seat": booking["seat"],
        "fee_charged": charge["charged"],
        "fee": _fee_text(charge),
        "payment_intent_id": charge.get("payment_intent_id", ""),
    }
    message_id = _send(ctx, booking["contact_email"], "confirmation", context)
    return {"message_id": message_id}


# --- compensation ---------------------------------------------------------------------------
def refund_fee(ctx: StepContext) -> dict[str, Any]:
    """Give back the fee of the exact charge this compensation undoes (`ctx.undoes`, from
    whatever branch it ran in), under this step's own key."""
    charge = _undone_charge(ctx)
    if not charge or not charge.get("charged"):
        return {"refunded": False, "amount_cents": 0}
    refund = PaymentGateway.from_settings().refund(
        payment_intent_id=charge["payment_intent_id"],
        amount_cents=charge["amount_cents"],
        key=ctx.idempotency_key,
        workflow_id=ctx.run_id,
    )
    return _refund_output(refund, charge)


def find_fee_refund(ctx: StepContext) -> dict[str, Any] | None:
    """Reconcile for `refund_fee`: the refund made under this step's key, found in the
    payment's refund list (consistent, unlike search), so a retry days later, past Stripe's key
    window, finishes instead of parking for ever. None: no refund was made."""
    charge = _undone_charge(ctx)
    if not charge or not charge.get("charged"):
        return {"refunded": False, "amount_cents": 0}
    refund = PaymentGateway.from_settings().find_refund_by_key(
        payment_intent_id=charge["payment_intent_id"], key=ctx.idempotency_key
    )
    return _refund_output(refund, charge) if refund is not None else None


def _undone_charge(ctx: StepContext) -> dict[str, Any] | None:
    """The output of the charge being undone, as the engine hands it over (never looked up
    by name: after a fork the current branch may hold none, or another)."""
    return ctx.undoes.output if ctx.undoes is not None else None


def _refund_output(refund: Refund, charge: dict[str, Any]) -> dict[str, Any]:
    return {
        "refunded": True,
        "refund_id": refund.id,
        "amount_cents": refund.amount_cents,
        "currency": charge["currency"],
    }


def notify_failure(ctx: StepContext) -> dict[str, Any]:
    """Tell the customer the change could not be made, why, and what happened to the fee.

    Only a request found to come from the booking's owner gets mail, at the contact e-mail on
    file; for any other nothing is sent (the address typed is unverified), and the status page
    alone gives the reason.
    """
    booking = ctx.output_of("fetch_booking") or {}
    charge = ctx.output_of("charge_customer") or {"charged": False, "amount_cents": 0}
    refund = ctx.output_of("refund_fee") or {"refunded": False}
    released = ctx.output_of("cancel_seat") or {}
    reason = _failure_reason(ctx)
    contact = booking.get("contact_email", "")
    if not contact:
        return {"sent": False, "reason": reason}
    context = {
        "passenger_name": booking.get("passenger_name", ""),
        "reference": booking.get("reference", ""),
        "old_flight": booking.get("flight", ""),
        "old_date_words": progress.date_in_words(booking.get("date", "")),
        "reason": reason,
        "fee_charged": charge.get("charged", False),
        "fee_refunded": refund.get("refunded", False),
        "fee": _fee_text(charge),
        "refund_id": refund.get("refund_id", ""),
        "seat_released": bool(released),
        "seat": released.get("seat", "") or booking.get("seat", ""),
    }
    message_id = _send(ctx, contact, "failure", context)
    return {"sent": True, "message_id": message_id, "reason": reason}


#: Generic explanations by failed step, for errors not written for the customer's eyes
#: (retries exhausted, a bug). Permanent errors from gateways and the policy are.
_STEP_TROUBLE = {
    "fetch_booking": "We couldn't reach the airline to look up your booking.",
    "cancel_seat": "The airline's system didn't respond when we tried to change your seat.",
    "charge_customer": "We couldn't reach our payment provider to take the change fee.",
    "issue_boarding_pass": "The airline couldn't issue your new boarding pass.",
}
_READABLE_PREFIXES = ("We ", "Your ", "Basic fares ", "These details ")


def _failure_reason(ctx: StepContext) -> str:
    run = durable.snapshot(ctx.run_id)
    if run is not None and run.cancel_requested:
        return "Our team stopped this change before it was finished."
    failed = next(
        (s for s in reversed(run.steps) if s.status == durable.StepStatus.FAILED), None
    ) if run else None  # fmt: skip
    if failed is None:
        return "Something went wrong on our side."
    if failed.error.startswith(_READABLE_PREFIXES):
        return failed.error
    return _STEP_TROUBLE.get(failed.name, "Something went wrong on our side.")


# --- helpers --------------------------------------------------------------------------------
def request_of(ctx: StepContext) -> RefundRequest:
    """The customer's request this run works on (the run's input names it)."""
    return request_of_refund_id((ctx.input or {}).get("refund_id"))


def request_of_refund_id(refund_id: str | None) -> RefundRequest:
    request = RefundRequest.objects.filter(public_id=refund_id).first() if refund_id else None
    if request is None:
        raise PermanentStepError(f"We couldn't find your request {refund_id or ''}".strip() + ".")
    return request


def _reference(ctx: StepContext) -> str:
    return ctx.output_of("load_request")["booking_reference"]


def _new_flight(ctx: StepContext) -> tuple[str, str]:
    """The flight and date the customer asked for, else those of their booking."""
    parsed = ctx.output_of("parse_flight_details") or {}
    booking = ctx.output_of("fetch_booking")
    return parsed.get("flight") or booking["flight"], parsed.get("date") or booking["date"]


def _fee_text(charge: dict[str, Any] | None) -> str:
    if not charge or not charge.get("charged"):
        return "none"
    return policy.format_amount(charge["amount_cents"], charge.get("currency", policy.CURRENCY))


def _send(ctx: StepContext, to: str, template: str, context: dict[str, Any]) -> str:
    """Mail `to`, which is always the booking's contact e-mail on file."""
    subject = render_to_string(f"refunds/email/{template}_subject.txt", context)
    body = render_to_string(f"refunds/email/{template}.txt", context)
    return Mailer.from_settings().send(
        to=to,
        subject=" ".join(subject.split()),
        body=body.strip() + "\n",
        key=ctx.idempotency_key,
        workflow_id=ctx.run_id,
    )
