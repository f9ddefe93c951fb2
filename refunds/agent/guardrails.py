"""Rules the refund agent cannot talk its way past: enforced by code, whatever the model says.

Pure functions of the call and the run's earlier tool calls (which the replay loop rebuilds from
checkpoints, so they are facts, not the model's account). A breach of a money rule fails the
run with a reason a customer may read, before any effect, and its compensations run (a fee
already taken is refunded). A missing earlier step is not a breach: the tool refuses, and the
model is told what to do first.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentflow.agent import ToolRecord, ToolRefused
from agentflow.durable import PermanentStepError
from refunds import policy, waivers


class GuardrailViolation(PermanentStepError):
    """The agent asked for something a refund must never do; nothing was done.

    Its message is what the customer reads on the status page and in the e-mail: it starts
    with `STOPPED`, then says what was refused.
    """


#: How every guardrail failure opens, for the customer's eyes.
STOPPED = "We stopped this change: our automated assistant asked"


def normalise_reference(reference: str) -> str:
    return reference.strip().upper()


def check_own_refund(requested: str, refund_id: str) -> None:
    """A tool acts only on the refund this run is about (set in code, not by the model)."""
    if requested.strip() != refund_id:
        raise GuardrailViolation(
            f"{STOPPED} to act on request {requested.strip()!r}, not on this request "
            f"({refund_id}), and nothing was done to it."
        )


def check_own_booking(requested: str, booking_reference: str) -> None:
    """…and only on that refund's booking, written in any case."""
    if normalise_reference(requested) != normalise_reference(booking_reference):
        raise GuardrailViolation(
            f"{STOPPED} to act on booking {normalise_reference(requested)}, which is not the "
            f"booking of this request ({normalise_reference(booking_reference)}), and nothing "
            "was done to it."
        )


def earlier_call(tool: str, history: Sequence[ToolRecord]) -> ToolRecord | None:
    """The run's earlier call of `tool` that ran, if any."""
    return next((record for record in history if record.ok and record.name == tool), None)


def check_charge_amount(amount_cents: int, *, fee_cents: int, reference: str) -> None:
    """The charge is exactly the policy's fee for the booking: never more, never less."""
    if amount_cents != fee_cents:
        raise GuardrailViolation(
            f"{STOPPED} to charge {policy.format_amount(amount_cents)}, but the change fee for "
            f"booking {normalise_reference(reference)} is {policy.format_amount(fee_cents)}, "
            "so no charge was made."
        )


def waiver_decisions(history: Sequence[ToolRecord]) -> list[waivers.Outcome]:
    """What our team decided on this run's fee waiver calls: approved (the tool ran), or
    rejected or timed out (the engine's answer in its place)."""
    found = (waivers.outcome_of(record.result) for record in history if record.name == waivers.STEP)
    return [outcome for outcome in found if outcome is not None]


def waiver_output(history: Sequence[ToolRecord]) -> object:
    """The latest fee waiver call's recorded result, approved or not (None: never asked)."""
    found = [record.result for record in history if record.name == waivers.STEP]
    return found[-1] if found else None


def waived_cents(history: Sequence[ToolRecord]) -> int:
    """The fee an approved waiver takes off (0 without one): the charge is the policy's fee
    less this, and nothing else the model says."""
    return max(
        (
            waivers.waived_cents(record.result)
            for record in history
            if record.ok and record.name == waivers.STEP
        ),
        default=0,
    )


def check_waiver_decided(history: Sequence[ToolRecord]) -> None:
    """A waiver the customer asked for (and the policy proposes) is decided by our team before
    the card is touched, so before the seat too (which waits for the fee)."""
    if not waiver_decisions(history):
        raise ToolRefused(
            "call request_fee_waiver first with the reason check_cancellation_policy's "
            "fee_waiver gives: the customer asked for the fee to be waived, and our team "
            "decides before the card is touched"
        )


def check_fee_secured(history: Sequence[ToolRecord]) -> None:
    """The seat is released only once the fee is held (even a fee of 0 goes through
    charge_customer): a declined card then fails the run with the customer's seat still theirs."""
    if not earlier_call("charge_customer", history):
        raise ToolRefused(
            "call charge_customer first: the fee is secured on the card before the seat is "
            "cancelled (charge 0 when the fee is 0)"
        )


def check_ready_to_issue(history: Sequence[ToolRecord]) -> None:
    """A new boarding pass only once the old seat is released and the fee is secured (even a
    fee of 0 goes through charge_customer), so no one gets a seat they did not pay for."""
    missing = [
        tool for tool in ("cancel_seat", "charge_customer") if not earlier_call(tool, history)
    ]
    if missing:
        raise ToolRefused(
            f"call {' and '.join(missing)} first: a new boarding pass is issued only after the "
            "fee is secured and the old seat is cancelled (charge 0 when the fee is 0)"
        )


def check_results_present(tool: str, needed: Sequence[str], history: Sequence[ToolRecord]) -> None:
    """`tool` builds on the results of `needed` tools from this run: say which are missing."""
    missing = [name for name in needed if not earlier_call(name, history)]
    if missing:
        raise ToolRefused(
            f"{tool} needs the results of {', '.join(missing)} from this request first"
        )
