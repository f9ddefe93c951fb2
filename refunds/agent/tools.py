"""The refund agent's tools: the graph workflow's partner clients, offered to a model.

Names and parameters are an interface (SPEC §5, README). Every tool first checks that it is
asked about this run's refund and booking (the run's input, set in code); side effects carry
the call's idempotency key exactly as graph steps do, and where the graph's step code fits it
is reused through `ctx.step_context()` rather than copied.
"""

from __future__ import annotations

import datetime
from dataclasses import asdict, replace
from typing import Annotated, Any

from pydantic import Field

from agentflow.agent import Toolbox, ToolContext, ToolRecord
from agentflow.durable import PermanentStepError, StepStatus, UndoneCall
from refunds import policy, steps
from refunds.agent import guardrails
from refunds.gateways import STRIPE_KEY_WINDOW_SECONDS, AirlineGateway, CrmGateway
from refunds.models import RefundRequest

toolbox = Toolbox("refund_agent")

RefundId = Annotated[
    str,
    Field(
        description="The refund request's id (rf_...), as given in the first message.",
        min_length=4,
        max_length=40,
    ),
]
BookingReference = Annotated[
    str,
    Field(description="The booking reference: six letters or digits.", pattern=r"^[A-Za-z0-9]{6}$"),
]
Flight = Annotated[
    str,
    Field(description="The flight number, e.g. SK1240.", pattern=r"^[A-Za-z0-9]{2}[0-9]{1,4}$"),
]
TravelDate = Annotated[datetime.date, Field(description="The travel date, YYYY-MM-DD.")]
AmountCents = Annotated[
    int,
    Field(
        description="The fee in cents: exactly the fee_cents check_cancellation_policy returned.",
        ge=0,
    ),
]
Note = Annotated[
    str, Field(description="One line for the customer's record.", min_length=1, max_length=2000)
]


# --- reads ----------------------------------------------------------------------------------
@toolbox.tool(
    "load_request",
    read_only=True,
    description="Load the customer's request: its booking reference and submission date.",
)
def load_request(ctx: ToolContext, refund_id: RefundId) -> dict[str, Any]:
    guardrails.check_own_refund(refund_id, _refund_id(ctx))
    return steps.load_request(ctx.step_context())


@toolbox.tool(
    "fetch_booking",
    read_only=True,
    description="Look the booking up at the airline: passenger, flight, date, seat, fare class.",
)
def fetch_booking(ctx: ToolContext, booking_reference: BookingReference) -> dict[str, Any]:
    reference = _own_booking(ctx, booking_reference)
    return asdict(AirlineGateway.from_settings().booking(reference))


@toolbox.tool(
    "check_cancellation_policy",
    read_only=True,
    description="Whether the booking may be changed, and the change fee in cents (fee_cents).",
)
def check_cancellation_policy(
    ctx: ToolContext, booking_reference: BookingReference
) -> dict[str, Any]:
    reference = _own_booking(ctx, booking_reference)
    rules = policy.policy_for(_booking(ctx, reference)["fare_class"])
    if not rules.rebookable:
        raise PermanentStepError(rules.refusal)  # as in the graph: the run fails and says why
    return {
        "booking_reference": reference,
        "fare_class": rules.fare_class,
        "rebookable": True,
        "fee_cents": rules.fee_cents,
        "currency": policy.CURRENCY,
    }


# --- effects --------------------------------------------------------------------------------
@toolbox.tool(
    "cancel_seat",
    side_effect=True,
    description="Cancel the seat on the booked flight (once per request).",
)
def cancel_seat(ctx: ToolContext, booking_reference: BookingReference) -> dict[str, Any]:
    reference = _own_booking(ctx, booking_reference)
    guardrails.check_once_per_run("cancel_seat", ctx.history)
    released = AirlineGateway.from_settings().cancel_seat(
        reference, key=ctx.idempotency_key, workflow_id=ctx.run_id
    )
    return {
        "cancellation_id": released.cancellation_id,
        "seat": released.seat,
        "status": released.status,
    }


def find_charge(ctx: ToolContext, refund_id: str, amount_cents: int) -> dict[str, Any] | None:
    """Reconcile for `charge_customer`: the payment made under this call's key, if any."""
    return steps.find_fee(ctx.idempotency_key) if amount_cents > 0 else None


@toolbox.tool(
    "charge_customer",
    side_effect=True,
    description="Charge the change fee to the card on the booking (once per request).",
    reconcile=find_charge,
    compensate="refund_fee",
    key_window_seconds=STRIPE_KEY_WINDOW_SECONDS,
)
def charge_customer(
    ctx: ToolContext, refund_id: RefundId, amount_cents: AmountCents
) -> dict[str, Any]:
    guardrails.check_own_refund(refund_id, _refund_id(ctx))
    reference = guardrails.normalise_reference(_request(ctx).booking_reference)
    guardrails.check_once_per_run("charge_customer", ctx.history)
    booking = _booking(ctx, reference)
    rules = policy.policy_for(booking["fare_class"])
    if not rules.rebookable:
        raise guardrails.GuardrailViolation(rules.refusal)
    guardrails.check_charge_amount(amount_cents, fee_cents=rules.fee_cents, reference=reference)
    return steps.take_fee(
        amount_cents=rules.fee_cents,
        currency=policy.CURRENCY,
        payment_method=booking["payment_method"],
        reference=reference,
        refund_id=_refund_id(ctx),
        key=ctx.idempotency_key,
        workflow_id=ctx.run_id,
    )


@toolbox.tool(
    "issue_boarding_pass",
    side_effect=True,
    description="Issue the boarding pass for the new flight and date (after cancel and charge).",
)
def issue_boarding_pass(
    ctx: ToolContext, booking_reference: BookingReference, flight: Flight, date: TravelDate
) -> dict[str, Any]:
    reference = _own_booking(ctx, booking_reference)
    guardrails.check_ready_to_issue(ctx.history)
    issued = AirlineGateway.from_settings().issue_boarding_pass(
        reference,
        flight=flight.upper(),
        date=date.isoformat(),
        key=ctx.idempotency_key,
        workflow_id=ctx.run_id,
    )
    return asdict(issued)


@toolbox.tool(
    "update_crm",
    side_effect=True,
    description="Add a note of what was done to the customer's record in the CRM.",
)
def update_crm(ctx: ToolContext, refund_id: RefundId, note: Note) -> dict[str, Any]:
    guardrails.check_own_refund(refund_id, _refund_id(ctx))
    request = _request(ctx)
    reference = guardrails.normalise_reference(request.booking_reference)
    update_id = CrmGateway.from_settings().update(
        customer_email=_booking(ctx, reference)["contact_email"],  # the address on file
        reference=reference,
        note=note,
        key=ctx.idempotency_key,
        workflow_id=ctx.run_id,
    )
    return {"update_id": update_id}


@toolbox.tool(
    "send_confirmation_email",
    side_effect=True,
    description="E-mail the customer their new flight, seat, boarding pass and fee.",
)
def send_confirmation_email(ctx: ToolContext, refund_id: RefundId) -> dict[str, Any]:
    guardrails.check_own_refund(refund_id, _refund_id(ctx))
    guardrails.check_results_present(
        "send_confirmation_email",
        ("load_request", "fetch_booking", "charge_customer", "issue_boarding_pass"),
        ctx.history,
    )
    return steps.send_confirmation_email(ctx.step_context())


# --- compensation (also the model's to call) -----------------------------------------------------
@toolbox.tool(
    "refund_fee",
    side_effect=True,
    description="Refund the change fee charged in this request, if one was (e.g. when the "
    "boarding pass cannot be issued).",
)
def refund_fee(ctx: ToolContext, refund_id: RefundId) -> dict[str, Any]:
    guardrails.check_own_refund(refund_id, _refund_id(ctx))
    earlier = guardrails.earlier_call("refund_fee", ctx.history)
    if earlier is not None:
        return earlier.result  # refunded already: the same answer, no second refund
    if ctx.undoes is None:  # the model asked, not the engine: undo this branch's one charge
        charge = guardrails.earlier_call("charge_customer", ctx.history)
        if charge is not None:
            ctx = replace(ctx, undoes=_as_undone(charge))
    return steps.refund_fee(ctx.step_context())


toolbox.validate()


# --- helpers --------------------------------------------------------------------------------
def _as_undone(record: ToolRecord) -> UndoneCall:
    return UndoneCall(
        name=record.name,
        seq=record.position,
        branch=0,
        status=StepStatus.COMPLETED,
        arguments=record.arguments,
        output=record.result,
        idempotency_key="",
    )


def _refund_id(ctx: ToolContext) -> str:
    return str((ctx.input or {}).get("refund_id", ""))


def _request(ctx: ToolContext) -> RefundRequest:
    request = RefundRequest.objects.filter(public_id=_refund_id(ctx)).first()
    if request is None:
        raise PermanentStepError(f"We couldn't find your request {_refund_id(ctx)}".strip() + ".")
    return request


def _own_booking(ctx: ToolContext, requested: str) -> str:
    """The run's booking reference, upper-cased, once `requested` is checked to be it."""
    own = _request(ctx).booking_reference
    guardrails.check_own_booking(requested, own)
    return guardrails.normalise_reference(own)


def _booking(ctx: ToolContext, reference: str) -> dict[str, Any]:
    """The booking as this run recorded it (so a retried charge sends the same parameters),
    else as the airline has it now."""
    for result in reversed(ctx.results_of("fetch_booking")):
        if result.get("reference") == reference:
            return result
    return asdict(AirlineGateway.from_settings().booking(reference))
