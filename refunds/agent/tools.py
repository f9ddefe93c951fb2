"""The refund agent's tools: the graph workflow's partner clients, offered to a model.

Names and parameters are an interface (docs/refunds.md, docs/agent.md). Every tool first checks that
it is asked about this run's refund and booking (the run's input, set in code); side effects carry
the call's idempotency key exactly as graph steps do, and where the graph's step code fits it
is reused through `ctx.step_context()` rather than copied. Each side effect may be made once
per run (the engine's default `max_calls=1`): a second seat cancellation, charge, boarding
pass, note or e-mail is refused and the model told. `refund_fee` is a compensation, not a
tool: the model never sees it; the engine runs it to undo this run's charge when the run fails.
"""

from __future__ import annotations

import datetime
from dataclasses import asdict
from typing import Annotated, Any, Literal

from pydantic import Field

from agentflow.agent import Toolbox, ToolContext, ToolRefused
from agentflow.durable import PermanentStepError
from refunds import fee, policy, steps, timetable, waivers
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
WaiverReason = Annotated[
    Literal[tuple(policy.WAIVER_REASONS)],  # type: ignore[valid-type]
    Field(
        description="Why the customer asks: the reason in check_cancellation_policy's fee_waiver."
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
        # The waiver the policy proposes for our team's approval, or None (refunds.waivers).
        "fee_waiver": waivers.proposal_output(waivers.proposal(_request(ctx), rules.fare_class)),
    }


# --- our team's decision ----------------------------------------------------------------------
@toolbox.tool(
    waivers.STEP,
    read_only=True,
    requires_approval=True,
    approval_arguments=waivers.tool_approval_arguments,
    sensitive=waivers.DETAILS,
    replies=waivers.REPLIES,
    description="Ask our team to waive the change fee, only when check_cancellation_policy "
    "returned a fee_waiver, with its reason. A person decides before it answers: approved, "
    "charge 0; rejected, charge the fee_cents. Before charge_customer.",
)
def request_fee_waiver(
    ctx: ToolContext, refund_id: RefundId, reason: WaiverReason
) -> dict[str, Any]:
    """Runs only once an operator approved this exact call (a rejection or a timeout reaches
    the model as the engine's `{"rejected": true, ...}` and this does not run). It waives only
    what the customer asked for and the policy proposes: another reason, or a waiver nobody
    asked for, is refused even when approved."""
    guardrails.check_own_refund(refund_id, _refund_id(ctx))
    request = _request(ctx)
    reference = guardrails.normalise_reference(request.booking_reference)
    proposed = waivers.proposal(request, _booking(ctx, reference)["fare_class"])
    if proposed is None:
        raise ToolRefused(
            "the customer did not ask for a fee waiver the policy considers: charge the fee_cents"
        )
    if reason != proposed.reason:
        raise ToolRefused(f"the customer asked for a waiver for {proposed.reason}, not {reason}")
    return waivers.granted_output(waivers.proposal_output(proposed) or {}, ctx.decision)


# --- effects --------------------------------------------------------------------------------
@toolbox.tool(
    "cancel_seat",
    side_effect=True,
    description="Cancel the seat on the booked flight (once per request, after charge_customer).",
    compensate="reinstate_seat",
)
def cancel_seat(ctx: ToolContext, booking_reference: BookingReference) -> dict[str, Any]:
    reference = _own_booking(ctx, booking_reference)
    guardrails.check_fee_secured(ctx.history)
    released = AirlineGateway.from_settings().cancel_seat(
        reference, key=ctx.idempotency_key, workflow_id=ctx.run_id
    )
    return {
        "cancellation_id": released.cancellation_id,
        "seat": released.seat,
        "status": released.status,
    }


def find_charge(ctx: ToolContext, refund_id: str, amount_cents: int) -> dict[str, Any] | None:
    """Reconcile for `charge_customer`: the hold made under this call's key, if any."""
    return fee.find_hold(ctx.idempotency_key) if amount_cents > 0 else None


@toolbox.tool(
    "charge_customer",
    side_effect=True,
    description="Secure the change fee on the card on the booking, before the seat is touched "
    "(once per request). The fee is held, and taken only once the new boarding pass is issued.",
    reconcile=find_charge,
    compensate="refund_fee",
    key_window_seconds=STRIPE_KEY_WINDOW_SECONDS,
)
def charge_customer(
    ctx: ToolContext, refund_id: RefundId, amount_cents: AmountCents
) -> dict[str, Any]:
    guardrails.check_own_refund(refund_id, _refund_id(ctx))
    reference = guardrails.normalise_reference(_request(ctx).booking_reference)
    booking = _booking(ctx, reference)
    rules = policy.policy_for(booking["fare_class"])
    if not rules.rebookable:
        raise PermanentStepError(rules.refusal)  # the fare's rule, already in customer words
    if waivers.proposal(_request(ctx), rules.fare_class) is not None:
        guardrails.check_waiver_decided(ctx.history)  # before the card is touched
    due = max(0, rules.fee_cents - guardrails.waived_cents(ctx.history))
    guardrails.check_charge_amount(amount_cents, fee_cents=due, reference=reference)
    return fee.hold(
        amount_cents=due,
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
    try:
        timetable.check_flight(flight, date.isoformat())
    except timetable.FlightNotSold as refused:
        hint = "Issue the flight and date the customer asked for."
        raise ToolRefused(f"Not issued: {refused} {hint}") from None
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
    return steps.confirm(ctx.step_context(), waiver=guardrails.waiver_output(ctx.history))


# --- compensations (the engine's alone: never offered to the model) -----------------------------
@toolbox.compensation("refund_fee")
def refund_fee(ctx: ToolContext, refund_id: RefundId) -> dict[str, Any]:
    """Undo `charge_customer` when the run fails after it, under this compensation's own key."""
    guardrails.check_own_refund(refund_id, _refund_id(ctx))
    return steps.refund_fee(ctx.step_context())


@toolbox.compensation("reinstate_seat")
def reinstate_seat(ctx: ToolContext, booking_reference: BookingReference) -> dict[str, Any]:
    """Undo `cancel_seat` when the run fails after it: the customer gets their seat back."""
    _own_booking(ctx, booking_reference)
    return steps.reinstate_seat(ctx.step_context())


toolbox.validate()


# --- helpers --------------------------------------------------------------------------------
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
