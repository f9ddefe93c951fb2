"""What each e-mail to the customer says, from what the run recorded, and sending it.

The templates (`templates/refunds/email/`) hold the e-mails' own sentences; what they fill in
is the run's facts (flights, seats, amounts, the partners' references) and sentences of
`refunds.wording` — why a change failed (`wording.failure`), what our team decided on a fee
waiver (`refunds.waivers`) — never a step's error, an operator's reason or name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.template.loader import render_to_string

from refunds import policy, waivers
from refunds.wording import date_in_words


def confirmation(outputs: Mapping[str, Any], *, reference: str, waiver: Any) -> dict[str, Any]:
    """The confirmation's context; `waiver` the fee waiver's recorded output (refunds.waivers),
    which an agent run's rejected call holds outside its tools' outputs."""
    booking = outputs["fetch_booking"]
    issued = outputs["issue_boarding_pass"]
    # The agent's model e-mails before its answer, which the capture follows: then the fee
    # is the hold that capture takes.
    charge = outputs.get("capture_fee") or outputs.get("charge_customer") or {}
    return {
        **issued,
        "reference": reference,
        "passenger_name": booking["passenger_name"],
        "origin": booking["origin"],
        "destination": booking["destination"],
        "fare_class": booking["fare_class"],
        "date_words": date_in_words(issued["date"]),
        "old_flight": booking["flight"],
        "old_date_words": date_in_words(booking["date"]),
        "old_seat": booking["seat"],
        "fee_charged": fee_due(charge),
        "fee": fee_text(charge),
        "payment_intent_id": charge.get("payment_intent_id", ""),
        **waivers.email_context(waiver),
    }


def failure(outputs: Mapping[str, Any], *, reason: str, waiver: Any) -> dict[str, Any]:
    """The failure e-mail's context: why (`reason`, from `wording.failure`), and what happened
    to the fee and the seat, read from what the run recorded (the hold, the capture, what was
    given back)."""
    booking = outputs.get("fetch_booking") or {}
    held = outputs.get("charge_customer") or {}
    taken = outputs.get("capture_fee") or {}
    given_back = outputs.get("refund_fee") or {}
    released = outputs.get("cancel_seat") or {}
    reinstated = outputs.get("reinstate_seat") or {}
    return {
        "passenger_name": booking.get("passenger_name", ""),
        "reference": booking.get("reference", ""),
        "old_flight": booking.get("flight", ""),
        "old_date_words": date_in_words(booking.get("date", "")),
        "reason": reason,
        "fee_refunded": bool(given_back.get("refunded")),
        "hold_released": bool(given_back.get("hold_released")),
        # Taken and not given back, or held and not released: a person must put it right.
        "fee_outstanding": bool(
            (taken.get("captured") or held.get("authorized")) and not given_back
        ),
        "fee": fee_text(held),
        "refund_id": given_back.get("refund_id", ""),
        "seat_released": bool(released) and not reinstated.get("reinstated"),
        "seat_reinstated": bool(reinstated.get("reinstated")),
        "seat": released.get("seat", "") or booking.get("seat", ""),
        **waivers.email_context(waiver),
    }


def render(template: str, context: Mapping[str, Any]) -> tuple[str, str]:
    """The e-mail's subject (one line) and body, from `refunds/email/<template>*.txt`."""
    subject = render_to_string(f"refunds/email/{template}_subject.txt", dict(context))
    body = render_to_string(f"refunds/email/{template}.txt", dict(context))
    return " ".join(subject.split()), body.strip() + "\n"


def fee_due(charge: Mapping[str, Any] | None) -> bool:
    """A fee taken (`capture_fee`) or held to be taken (`charge_customer`)."""
    return bool(charge and (charge.get("captured") or charge.get("authorized")))


def fee_text(charge: Mapping[str, Any] | None) -> str:
    if not charge or not fee_due(charge):
        return "none"
    return policy.format_amount(charge["amount_cents"], charge.get("currency", policy.CURRENCY))
