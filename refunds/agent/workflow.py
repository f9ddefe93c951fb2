"""The refund as an agent run (`REFUNDS_ENGINE=agent`): the same refund, the same partners, the
model choosing the order of the tools.

Code, not the prompt, decides what must hold. Before the model is first asked, steps in code
check that the request comes from the booking's owner and that the flight asked for is in the
airline's schedule (as the graph workflow does before any effect); the tools enforce the fee and
that it is held before the seat is touched; the engine enforces one call of each side effect per
run (`max_calls`), the tool-call caps and the turn and token limits. The model's
`charge_customer` only holds the fee: it is taken by `capture_fee`, a step in code after the
model's answer, and only once `rebooked` says the change was made — so no answer of the model's
can keep money for a change that did not happen; otherwise the run fails. A failure gives back
what was taken (the hold released or the fee refunded: `refund_fee`; the seat:
`reinstate_seat`, the compensations of the calls they undo, which only the engine runs) and
tells the customer (`notify_failure`, the graph workflow's own step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentflow import durable
from agentflow.agent import ToolRecord, tool_result_message
from refunds import ownership, priorities, privacy, steps, timetable, waivers
from refunds.agent import prompts
from refunds.agent.planner import scripted_refund_model
from refunds.agent.tools import toolbox
from refunds.gateways import (
    COMPENSATION_RETRY,
    STRIPE_CAPTURE_WINDOW_SECONDS,
    AirlineGateway,
    BookingNotFound,
)
from refunds.parsing import parse_request


def results(history: Sequence[ToolRecord], tool: str) -> list[Any]:
    """What the calls of `tool` that ran returned (refused calls did nothing)."""
    return [record.result for record in history if record.ok and record.name == tool]


def fee_secured_once(history: Sequence[ToolRecord]) -> bool:
    """The fee is settled exactly once: one charge call that held it on the card, or said none
    was due (the charge tool takes exactly the policy's fee less what our team waived, so
    "nothing held" means a free change or a waived fee). `capture_fee` takes a held fee only
    once the whole change is done."""
    charges = results(history, "charge_customer")
    return len(charges) == 1 and bool(
        charges[0].get("authorized") or charges[0].get("amount_cents") == 0
    )


def rebooked(history: Sequence[ToolRecord]) -> str | None:
    """The refund's "done", over what its calls recorded: the seat changed once, the fee
    secured once (or none due), one boarding pass, the customer told once. None when done; else
    what is missing, in words a customer may read."""
    missing = []
    if len(results(history, "cancel_seat")) != 1:
        missing.append("your seat was not changed")
    if not fee_secured_once(history):
        missing.append("the change fee was not settled")
    if len(results(history, "issue_boarding_pass")) != 1:
        missing.append("no new boarding pass was issued")
    if len(results(history, "send_confirmation_email")) != 1:
        missing.append("no confirmation was sent")
    if not missing:
        return None
    return f"We couldn't finish changing your booking: {'; '.join(missing)}."


#: v2: `check_flight` asks the airline's schedule in code before the model is first asked; the
#: fee is held by `charge_customer` (before `cancel_seat`) and taken by `capture_fee` in code
#: after the answer; `refund_fee` and `reinstate_seat` are the engine's alone. v1 runs still in
#: flight are parked for an operator.
#: v3: `request_fee_waiver`, declared `requires_approval`, asks our team to waive the fee the
#: customer asked to have waived, before `charge_customer` (which refuses until it is decided,
#: and then charges the policy's fee less what was waived). v2 runs in flight are parked.
refund_agent = durable.CodeWorkflow(
    "refund_agent",
    version=3,
    toolbox=toolbox,
    model=scripted_refund_model,
    on_failure="notify_failure",
    done=rebooked,
    sensitive_input=waivers.STATUS_PAGE_KEY,
    personal=privacy.REFUND_AGENT,
    priority=priorities.CUSTOMER,
    concurrency_key=priorities.booking_of,
    concurrency_limit=priorities.PER_BOOKING,
)
refund_agent.compensation("notify_failure", retry=COMPENSATION_RETRY)(steps.notify_failure)


def verify_ownership(ctx: durable.StepContext) -> dict[str, Any]:
    """The request's last name and e-mail must be the booking's passenger and contact on file
    (refunds.ownership). Only the verdict is recorded: nothing of someone else's booking is
    ever checkpointed, and a mismatch never says which detail was wrong."""
    request = steps.request_of(ctx)
    reference = request.booking_reference.strip().upper()
    try:
        booking = AirlineGateway.from_settings().booking(reference)
    except BookingNotFound:
        raise durable.PermanentStepError(ownership.MISMATCH) from None
    if not ownership.is_owner(
        last_name=request.last_name,
        email=request.email,
        passenger_last_name=booking.passenger_last_name,
        contact_email=booking.contact_email,
    ):
        raise durable.PermanentStepError(ownership.MISMATCH)
    return {"verified": True, "booking_reference": reference}


def check_flight(ctx: durable.StepContext) -> dict[str, Any]:
    """The flight and date the customer asked for (else their booking's, as the graph reads
    them) are in the airline's schedule: a refusal the customer can read, before any effect."""
    request = steps.request_of(ctx)
    reference = request.booking_reference.strip().upper()
    # As the graph's check_cancellation_policy: an earlier request (its runs go one at a time)
    # may have changed the booking; said after the owner check, before any effect.
    held = AirlineGateway.from_settings().booking(reference).seat_held
    changed = priorities.already_changed(request, seat_held=held)
    if changed:
        raise durable.PermanentStepError(changed)
    wanted = parse_request(request.message, reference, today=request.created_at.date())
    flight, date = wanted.flight, wanted.date
    if not (flight and date):
        booking = AirlineGateway.from_settings().booking(reference)
        flight, date = flight or booking.flight, date or booking.date
    return timetable.check_flight(flight, date)


@refund_agent.run
def rebook(ctx: durable.AgentContext) -> str:
    """Check the owner and the flight asked for in code, let the model work through the tools
    until it answers, then take the held fee if the change was made."""
    ctx.step("verify_ownership", verify_ownership)
    ctx.step("check_flight", check_flight)
    request = steps.request_of_refund_id(ctx.input["refund_id"])
    messages = list(prompts.opening_messages(request.public_id, request.message))
    while not (turn := ctx.llm(messages)).is_final:
        messages.append(turn.message)
        for call in turn.tool_calls:
            shown = prompts.shown_to_model(call.name, ctx.tool(call).result)
            messages.append(tool_result_message(call.id, shown))
    if rebooked(ctx.history) is None:  # else the engine's `done` fails the run: nothing taken
        ctx.step(
            "capture_fee",
            steps.capture_fee,
            kind="effect",
            reconcile=steps.find_fee_capture,
            key_window_seconds=STRIPE_CAPTURE_WINDOW_SECONDS,
        )
    return turn.text
