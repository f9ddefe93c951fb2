"""Whether the flight and date asked for can be sold: the airline's schedule, asked before
anything changes, so a flight that does not exist is a refusal the customer can read rather
than a seat released and a fee taken for a boarding pass that can never be valid.

Both engines ask it the same way: the graph workflow's `check_flight` step, the agent's check
in code before its model is first asked, and the agent's boarding-pass tool.
"""

from __future__ import annotations

from typing import Any

from agentflow.durable import PermanentStepError
from refunds.gateways import AirlineGateway, ScheduledFlight
from refunds.wording import date_in_words


class FlightNotSold(PermanentStepError):
    """The airline does not sell that flight on that date; its message is for the customer."""


def check_flight(flight: str, date: str) -> dict[str, Any]:
    """The flight and date, once the airline's schedule says they are sold today.

    Raises:
        FlightNotSold: a past date, one beyond the airline's horizon, or no such flight then.
    """
    answer = AirlineGateway.from_settings().scheduled_flight(flight.strip().upper(), date)
    if not answer.operates:
        raise FlightNotSold(refusal(answer))
    return {"flight": answer.flight, "date": answer.date, "operates": True}


def refusal(answer: ScheduledFlight) -> str:
    """Why the change cannot be made, in the customer's words (starts "We ", as the status page
    and the failure e-mail show such reasons as they are)."""
    when = date_in_words(answer.date)
    if answer.reason == "past":
        return f"We can't move you to {when}: that date has already passed."
    if answer.reason == "beyond_horizon":
        last = date_in_words(answer.last_bookable_date)
        return (
            f"We can't book {when} yet: the airline sells seats up to {last}. "
            "Please ask again nearer the time, or choose an earlier date."
        )
    return (
        f"We couldn't find flight {answer.flight} on {when} in the airline's schedule. "
        "Please check the flight number and date and send a new request."
    )
