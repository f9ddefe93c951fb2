"""The sandbox airline's calendar as the suite reads it, so that no test depends on today's date.

Every sandbox the suite starts (`tests.support.sandbox`) runs with this site's
SANDBOX_TODAY_OFFSET_DAYS, so a day a test asks for is counted from the today the sandbox sells
from: `SANDBOX_TODAY_OFFSET_DAYS=365 pytest tests/refunds` runs the refund tests a year from now.
Code under test that reads the clock in this process is frozen with time-machine instead.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings

from refunds.progress import date_in_words
from refunds.sandbox import airline


@dataclass(frozen=True, kw_only=True)
class NewFlight:
    """A flight and a day the airline sells it on, as a customer asks for them."""

    flight: str
    day: datetime.date

    @property
    def date(self) -> str:
        """The day as ISO, as the steps, the ledger and the agent's tools carry it."""
        return self.day.isoformat()

    @property
    def in_words(self) -> str:
        """The day as the customer reads it: 'Tuesday 16 March 2027'."""
        return date_in_words(self.date)

    def words(self, template: str = "Please move me to {flight} on {date}, thanks!") -> str:
        """What the customer writes to ask for it."""
        return template.format(flight=self.flight, date=self.date)


def airline_today() -> datetime.date:
    """The sandbox's today: the real UTC date moved by SANDBOX_TODAY_OFFSET_DAYS."""
    return airline.today(offset_days=settings.SANDBOX_TODAY_OFFSET_DAYS)


def new_flight(flight: str = "SK1240", *, weeks_ahead: int = 14) -> NewFlight:
    """`flight` on the first day it flies `weeks_ahead` after the airline's today (SK1240 flies
    every day but Wednesday), well inside the airline's horizon."""
    start = airline_today() + timedelta(weeks=weeks_ahead)
    return NewFlight(flight=flight, day=airline.next_operating_day(flight, start))


def day_off(flight: str = "SK1240", *, weeks_ahead: int = 3) -> datetime.date:
    """A day inside the horizon, `weeks_ahead` or a little more from the airline's today, on
    which `flight` does not fly."""
    off = (set(range(7)) - airline.operating_weekdays(flight)).pop()
    start = airline_today() + timedelta(weeks=weeks_ahead)
    return start + timedelta(days=(off - start.weekday()) % 7)
