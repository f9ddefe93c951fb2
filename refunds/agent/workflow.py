"""The refund as an agent run (`REFUNDS_ENGINE=agent`): the same refund, the same partners, the
model choosing the order of the tools.

Code, not the prompt, decides what must hold. Before the model is first asked, a step in code
checks that the request comes from the booking's owner (as the graph workflow does before any
effect); the tools enforce the fee, one charge and one seat per run, and the fee held before
the seat is touched; the engine enforces the turn and token limits. The model's
`charge_customer` only holds the fee: it is taken by `capture_fee`, a step in code after the
model's answer, and only if a new boarding pass was issued — so no answer of the model's can
keep money for a change that did not happen. A failure gives back what was taken (the hold
released or the fee refunded: `refund_fee`; the seat: `reinstate_seat`, the compensations of
the calls they undo) and tells the customer (`notify_failure`, the graph workflow's own step).
"""

from __future__ import annotations

from typing import Any

from agentflow import durable
from agentflow.agent import tool_result_message
from refunds import ownership, steps
from refunds.agent import prompts
from refunds.agent.planner import scripted_refund_model
from refunds.agent.tools import toolbox
from refunds.gateways import (
    COMPENSATION_RETRY,
    STRIPE_CAPTURE_WINDOW_SECONDS,
    AirlineGateway,
    BookingNotFound,
)

#: v2: the fee is held by `charge_customer` (before `cancel_seat`) and taken by `capture_fee` in
#: code after the answer; v1 runs still in flight are parked for an operator.
refund_agent = durable.CodeWorkflow(
    "refund_agent",
    version=2,
    toolbox=toolbox,
    model=scripted_refund_model,
    on_failure="notify_failure",
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


@refund_agent.run
def rebook(ctx: durable.AgentContext) -> str:
    """Check the owner in code, let the model work through the tools until it answers, then
    take the held fee."""
    ctx.step("verify_ownership", verify_ownership)
    request = steps.request_of_refund_id(ctx.input["refund_id"])
    messages = list(prompts.opening_messages(request.public_id, request.message))
    while not (turn := ctx.llm(messages)).is_final:
        messages.append(turn.message)
        for call in turn.tool_calls:
            shown = prompts.shown_to_model(call.name, ctx.tool(call).result)
            messages.append(tool_result_message(call.id, shown))
    ctx.step(
        "capture_fee",
        steps.capture_fee,
        kind="effect",
        reconcile=steps.find_fee_capture,
        key_window_seconds=STRIPE_CAPTURE_WINDOW_SECONDS,
    )
    return turn.text
