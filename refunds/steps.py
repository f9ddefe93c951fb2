"""The refund workflow's steps: one side effect each, carrying the step's idempotency key.

Outputs are small JSON dicts holding what later steps and the status page need (ids, seat,
amounts). The customer's words and the address they typed stay in their RefundRequest row;
mail goes to the booking's contact e-mail on file (in `fetch_booking`'s output), and only once
`fetch_booking` has found the request to come from the booking's owner.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from agentflow import durable
from agentflow.durable import PermanentStepError, StepContext
from refunds import emails, fee, ownership, policy, priorities, timetable, waivers, wording
from refunds.gateways import (
    AirlineGateway,
    BookingNotFound,
    CrmGateway,
    Mailer,
    SeatCancellation,
    SeatReinstatement,
)
from refunds.models import RefundRequest
from refunds.parsing import parse_request


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


def check_flight(ctx: StepContext) -> dict[str, Any]:
    """The new flight and date (the customer's, else their booking's) are in the airline's
    schedule, before any effect: a flight that does not fly that day changes nothing."""
    flight, date = _new_flight(ctx)
    return timetable.check_flight(flight, date)


def check_cancellation_policy(ctx: StepContext) -> dict[str, Any]:
    """The fare's rules, and the fee waiver they propose for an operator's approval when the
    customer asked for one for a reason the policy considers (refunds.waivers)."""
    booking = ctx.output_of("fetch_booking")
    # Runs of one booking go one at a time: an earlier request may have changed it meanwhile.
    # Said here, after the owner check (the request still counts as the owner's) and before
    # any effect.
    changed = priorities.already_changed(
        request_of(ctx), seat_held=bool(booking.get("seat_held", True))
    )
    if changed:
        raise PermanentStepError(changed)
    rules = policy.policy_for(booking["fare_class"])
    if not rules.rebookable:
        raise PermanentStepError(rules.refusal)
    proposed = waivers.proposal(request_of(ctx), rules.fare_class)
    return {
        "fare_class": rules.fare_class,
        "rebookable": True,
        "fee_cents": rules.fee_cents,
        "fee_waiver": waivers.proposal_output(proposed),
    }


def fee_waiver_arguments(ctx: StepContext) -> dict[str, Any]:
    """What the operator approves or rejects before `request_fee_waiver` (refunds.waivers)."""
    return waivers.approval_arguments(request_of(ctx), waivers.proposed_in(ctx))


def calculate_penalty_fee(ctx: StepContext) -> dict[str, Any]:
    """The policy's fee, less a waiver an operator approved (then 0: nothing is held)."""
    due = policy.calculate_penalty_fee(ctx.output_of("fetch_booking")["fare_class"])
    waived = waivers.waived_cents(ctx.output_of(waivers.STEP))
    if not waived:
        return due
    return {
        **due,
        "amount_cents": max(0, int(due["amount_cents"]) - waived),
        "waived_cents": waived,
    }


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
    """Hold the change fee on the card before the seat is touched (refunds.fee). Every
    parameter comes from earlier checkpoints, so a retry sends exactly the same request under
    the same key and Stripe replays instead of holding twice."""
    charge = ctx.output_of("calculate_penalty_fee")
    return fee.hold(
        amount_cents=charge["amount_cents"],
        currency=charge["currency"],
        payment_method=ctx.output_of("fetch_booking")["payment_method"],
        reference=_reference(ctx),
        refund_id=ctx.input["refund_id"],
        key=ctx.idempotency_key,
        workflow_id=ctx.run_id,
    )


def find_fee_hold(ctx: StepContext) -> dict[str, Any] | None:
    """Reconcile for `charge_customer` (docs/protocol.md, "Unknown outcomes"): the hold made under
    this step's key.

    Finding none proves nothing: Stripe's search index can lag a fresh payment by up to a
    minute, so "not found" is `OutcomeUnknown`. Inside Stripe's 24-hour key window the engine
    then retries under the same key (Stripe replays a payment that exists); after the retries,
    or past the window, it parks the run for an operator rather than guess with money.
    """
    charge = ctx.output_of("calculate_penalty_fee")
    if not charge or charge["amount_cents"] <= 0:
        return None  # nothing is ever sent for a free change: running the step again is safe
    return fee.find_hold(ctx.idempotency_key)


def capture_fee(ctx: StepContext) -> dict[str, Any]:
    """Take the held fee, once the new boarding pass is issued (both engines: in agent mode it
    runs in code after the model's answer, and only if the pass exists)."""
    if not ctx.output_of("issue_boarding_pass"):
        raise PermanentStepError(
            "We couldn't finish changing your booking, so we did not take the change fee."
        )
    return fee.capture(ctx.output_of("charge_customer") or {}, key=ctx.idempotency_key)


def find_fee_capture(ctx: StepContext) -> dict[str, Any] | None:
    """Reconcile for `capture_fee`: the payment as Stripe has it now (refunds.fee)."""
    return fee.find_capture(ctx.output_of("charge_customer") or {})


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
    taken = emails.fee_text(ctx.output_of("capture_fee"))
    note = (
        f"Rebooked onto {issued['flight']} on {issued['date']}, seat {issued['seat']} "
        f"(boarding pass {issued['boarding_pass_id']}). Fee: {taken}. "
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
    return confirm(ctx, waiver=ctx.output_of(waivers.STEP))


def confirm(ctx: StepContext, *, waiver: Any) -> dict[str, Any]:
    """The confirmation e-mail; `waiver` the fee waiver's recorded output (refunds.waivers),
    which an agent run's rejected call holds outside its tools' outputs."""
    context = emails.confirmation(ctx.outputs, reference=_reference(ctx), waiver=waiver)
    message_id = _send(
        ctx, ctx.output_of("fetch_booking")["contact_email"], "confirmation", context
    )
    return {"message_id": message_id}


# --- compensations ---------------------------------------------------------------------------
def undone_output(ctx: StepContext) -> dict[str, Any]:
    """The recorded output of the exact call a compensation undoes, as the engine hands it over
    (`ctx.undoes`, from whatever branch it ran in): never looked up by name, since after a fork
    the current branch may hold none of it, or another call's."""
    return (ctx.undoes.output if ctx.undoes is not None else None) or {}


def refund_fee(ctx: StepContext) -> dict[str, Any]:
    """Give the fee back after a later permanent failure, under this step's own key: the hold
    released if the fee was not taken yet, else a refund in full (refunds.fee)."""
    return fee.give_back(undone_output(ctx), key=ctx.idempotency_key, workflow_id=ctx.run_id)


def find_fee_refund(ctx: StepContext) -> dict[str, Any] | None:
    """Reconcile for `refund_fee`: the refund under this step's key, found in the payment's
    refund list (consistent, unlike search), or the hold already gone; so a retry days later,
    past Stripe's key window, finishes instead of parking for ever. None: nothing given back."""
    return fee.find_given_back(undone_output(ctx), key=ctx.idempotency_key)


def reinstate_seat(ctx: StepContext) -> dict[str, Any]:
    """Give the customer their released seat back after a later failure (once, by key)."""
    released = undone_output(ctx)
    if not released:
        return {"reinstated": False}
    back = AirlineGateway.from_settings().reinstate_seat(
        _reference(ctx),
        cancellation_id=released["cancellation_id"],
        key=ctx.idempotency_key,
        workflow_id=ctx.run_id,
    )
    return _reinstatement_output(back)


def find_seat_reinstatement(ctx: StepContext) -> dict[str, Any] | None:
    """Reconcile for `reinstate_seat`: the airline's reinstatement under this step's key."""
    if not undone_output(ctx):
        return {"reinstated": False}
    found = AirlineGateway.from_settings().find_seat_reinstatement(key=ctx.idempotency_key)
    return _reinstatement_output(found) if found is not None else None


def _reinstatement_output(back: SeatReinstatement) -> dict[str, Any]:
    return {"reinstated": True, "reinstatement_id": back.reinstatement_id, "seat": back.seat}


def notify_failure(ctx: StepContext) -> dict[str, Any]:
    """Tell the customer the change could not be made, why, and what happened to the fee and
    the seat, read from what the run recorded (the hold, the capture, what was given back).

    Only a request found to come from the booking's owner gets mail, at the contact e-mail on
    file; for any other nothing is sent (the address typed is unverified), and the status page
    alone gives the reason.
    """
    reason = _failure_reason(ctx)
    contact = (ctx.output_of("fetch_booking") or {}).get("contact_email", "")
    if not contact:
        return {"sent": False, "reason": reason}
    context = emails.failure(ctx.outputs, reason=reason, waiver=waivers.recorded(ctx))
    message_id = _send(ctx, contact, "failure", context)
    return {"sent": True, "message_id": message_id, "reason": reason}


def _failure_reason(ctx: StepContext) -> str:
    """Why the change failed, as the customer is told (refunds.wording): the sentence the
    failing step's error was written as, else that step's plain one; never the error itself."""
    run = durable.snapshot(ctx.run_id)
    if run is not None and run.cancel_requested:
        return wording.TEAM_STOPPED
    failed = (
        next((s for s in reversed(run.steps) if s.status == durable.StepStatus.FAILED), None)
        if run
        else None
    )
    if failed is None:  # it failed between steps: a limit, or the agent stopped short
        return wording.failure(None, run.error if run else "")
    return wording.failure(failed.name.split("@", 1)[0], failed.error)


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


def _send(ctx: StepContext, to: str, template: str, context: dict[str, Any]) -> str:
    """Mail `to`, which is always the booking's contact e-mail on file."""
    subject, body = emails.render(template, context)
    return Mailer.from_settings().send(
        to=to, subject=subject, body=body, key=ctx.idempotency_key, workflow_id=ctx.run_id
    )
