"""The scripted refund planner: the refund agent's offline default model.

A deterministic function of the conversation so far: it reads which tools have answered and
asks for what comes next, several calls per turn where they belong together (the two lookups;
the fee, then the seat; the note and the e-mail), then answers the customer. The same
conversation always gets the same turn, so a resumed run asks for exactly what the
uninterrupted run would have. Six turns for a standard refund; one more when the policy proposes
a fee waiver, which it asks our team for before the fee (approved: it charges 0; rejected or
timed out, the engine's `{"rejected": true}` in its place: the policy's fee).
"""

from __future__ import annotations

from datetime import date
from typing import Any

from agentflow.agent import ModelRequest, Plan, ScriptedModel, answer, call, calls, tool_exchanges
from refunds import policy
from refunds.agent.prompts import read_first_user_message
from refunds.parsing import parse_request

#: The model name recorded in every turn's fingerprint: bump it when the planner's choices change.
MODEL = "scripted-refund-planner-3"


def plan_refund(request: ModelRequest) -> Plan:
    refund_id, words = _opening(request)
    done: dict[str, Any] = {}
    for exchange in tool_exchanges(request.messages):
        result = exchange.result
        if isinstance(result, dict) and "error" in result:
            return answer(
                "I'm sorry, I couldn't finish changing your booking: "
                f"{result.get('message', result['error'])}"
            )
        done[exchange.call.name] = result

    if "load_request" not in done:
        return calls(call("load_request", refund_id=refund_id))
    reference = done["load_request"]["booking_reference"]
    lookups = [
        call(name, booking_reference=reference)
        for name in ("fetch_booking", "check_cancellation_policy")
        if name not in done
    ]
    if lookups:
        return calls(*lookups)
    proposed = done["check_cancellation_policy"].get("fee_waiver")
    if proposed and "request_fee_waiver" not in done:  # decided before the card is touched
        return calls(call("request_fee_waiver", refund_id=refund_id, reason=proposed["reason"]))
    effects = []
    if "charge_customer" not in done:  # the fee is secured before the seat is touched
        fee = done["check_cancellation_policy"]["fee_cents"]
        if (done.get("request_fee_waiver") or {}).get("waived") is True:
            fee = 0
        effects.append(call("charge_customer", refund_id=refund_id, amount_cents=fee))
    if "cancel_seat" not in done:
        effects.append(call("cancel_seat", booking_reference=reference))
    if effects:
        return calls(*effects)
    if "issue_boarding_pass" not in done:
        flight, when = _wanted_flight(words, reference, done)
        return calls(
            call("issue_boarding_pass", booking_reference=reference, flight=flight, date=when)
        )
    wrap_up = []
    if "update_crm" not in done:
        wrap_up.append(call("update_crm", refund_id=refund_id, note=_crm_note(words, done)))
    if "send_confirmation_email" not in done:
        wrap_up.append(call("send_confirmation_email", refund_id=refund_id))
    if wrap_up:
        return calls(*wrap_up)
    return answer(_customer_answer(done))


scripted_refund_model = ScriptedModel(MODEL, plan_refund)


def _opening(request: ModelRequest) -> tuple[str, str]:
    first = next(m for m in request.messages if m.get("role") == "user")
    return read_first_user_message(first["content"])


def _wanted_flight(words: str, reference: str, done: dict[str, Any]) -> tuple[str, str]:
    """The flight and date the customer asked for, else those of their booking (as the graph
    workflow reads them, anchored on the submission date)."""
    parsed = _parsed(words, reference, done)
    booking = done["fetch_booking"]
    return parsed.flight or booking["flight"], parsed.date or booking["date"]


def _parsed(words: str, reference: str, done: dict[str, Any]) -> Any:
    submitted = date.fromisoformat(done["load_request"]["submitted_on"])
    return parse_request(words, reference, today=submitted)


def _fee_text(charge: dict[str, Any]) -> str:
    if not charge.get("authorized"):
        return "none"
    return policy.format_amount(charge["amount_cents"], charge.get("currency", policy.CURRENCY))


def _crm_note(words: str, done: dict[str, Any]) -> str:
    issued, charge = done["issue_boarding_pass"], done["charge_customer"]
    summary = _parsed(words, done["load_request"]["booking_reference"], done).summary
    return (
        f"Rebooked onto {issued['flight']} on {issued['date']}, seat {issued['seat']} "
        f"(boarding pass {issued['boarding_pass_id']}). Fee: {_fee_text(charge)}. "
        f"Customer asked: {summary}."
    )


def _customer_answer(done: dict[str, Any]) -> str:
    issued, charge = done["issue_boarding_pass"], done["charge_customer"]
    waiver = done.get("request_fee_waiver") or {}
    if waiver.get("waived") is True:
        fee = "Our team waived the change fee."
    elif charge.get("authorized"):
        refused = "Our team couldn't waive it, so w" if waiver.get("rejected") else "W"
        fee = f"{refused}e charged the {_fee_text(charge)} change fee."
    else:
        fee = "There was no change fee."
    return (
        f"You're booked on {issued['flight']} on {issued['date']}, seat {issued['seat']} "
        f"(boarding pass {issued['boarding_pass_id']}). {fee} Your confirmation is on its way "
        "by e-mail."
    )
