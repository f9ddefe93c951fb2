"""The airline partner: bookings derived from their reference, its schedule derived from the
flight number and date, seat cancels and reinstatements, boarding passes.

Its calendar is its own: `today(offset_days=…)` is the UTC date moved by the sandbox's offset
(`manage.py sandbox --today-offset-days N`, by default SANDBOX_TODAY_OFFSET_DAYS), and each
booking leaves as many days after that today as its reference says, so every booking is one
the airline still sells, this year or any other.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import secrets
import sqlite3
import unicodedata
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from refunds.sandbox import faults
from refunds.sandbox.idempotency import Effect
from refunds.sandbox.messages import Invalid, Request, Response, partner_error
from refunds.sandbox.state import Store, add_effect

REFERENCE = re.compile(r"[A-Za-z0-9]{6}")
FIRST_NAMES = (
    "Astrid",
    "Bjorn",
    "Camille",
    "Dmitri",
    "Elena",
    "Farah",
    "Goran",
    "Hana",
    "Ines",
    "Jonas",
    "Kaito",
    "Lena",
    "Mateo",
    "Nadia",
    "Oskar",
    "Priya",
)
#: Some with accents and spaces, as real passengers' names have.
LAST_NAMES = (
    "Andersen",
    "Berg",
    "Costa",
    "Dahl",
    "Eriksen",
    "Müller",
    "Åberg",
    "Ivanova",
    "Jensen",
    "Kowalski",
    "Lund",
    "Moreau",
    "Nakamura",
    "Olsen",
    "Patel",
    "da Silva",
)
#: Where the sandbox's passengers receive mail (RFC 2606: never a real mailbox).
CONTACT_DOMAIN = "example.com"
AIRPORTS = ("CPH", "OSL", "ARN", "HEL", "LHR", "CDG", "FRA", "AMS", "BCN", "FCO", "JFK", "KEF")
FARE_CLASSES = {"F": "flex", "B": "basic"}
SEAT_LETTERS = "ABCDEF"


def today(*, offset_days: int = 0) -> date:
    """The airline's today: the UTC date, `offset_days` later (a sandbox moved a year ahead
    shows what its calendar will be; time-machine moves it too, as it moves the clock)."""
    return datetime.now(UTC).date() + timedelta(days=offset_days)


def booking(reference: str, *, today: date) -> dict[str, Any]:
    """The booking for a valid reference as the airline shows it on `today`: the same for a
    reference on a given day (seeded by the reference's hash). Its flight leaves as many days
    after `today` as the reference says (BOOKED_DAYS_AHEAD), on a day it flies, so a booking
    lives in the airline's calendar: never in the past, never beyond the seats it sells."""
    ref = reference.upper()
    rng = random.Random(hashlib.sha256(ref.encode()).hexdigest())
    origin, destination = rng.sample(AIRPORTS, 2)
    first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
    flight = f"SK{rng.randint(100, 9999)}"
    booked_day = today + timedelta(days=rng.randint(*BOOKED_DAYS_AHEAD))
    return {
        "reference": ref,
        "passenger": {"name": f"{first} {last}", "first_name": first, "last_name": last},
        "contact_email": contact_email(first, last, ref),
        "flight": flight,
        "date": next_operating_day(flight, booked_day).isoformat(),
        "origin": origin,
        "destination": destination,
        "seat": _seat(rng),
        "fare_class": FARE_CLASSES.get(ref[0], "standard"),
        "payment_method": _payment_method(ref),
        "status": "confirmed",
    }


@dataclass(frozen=True, kw_only=True)
class Owner:
    """What the booking's owner types into the refund form: their last name and e-mail."""

    last_name: str
    email: str


def owner_of(reference: str) -> Owner:
    """The right details for `reference`: what tests and the chaos traffic submit (the same
    on any day: only the booking's date moves with the calendar)."""
    passenger = _undated(reference)
    return Owner(last_name=passenger["passenger"]["last_name"], email=passenger["contact_email"])


def _undated(reference: str) -> dict[str, Any]:
    """The booking as on any day: its passenger, contact, flight and seat (not its date)."""
    return booking(reference, today=date.min)


def contact_email(first: str, last: str, reference: str) -> str:
    """'Åsa', 'da Silva', 'ABC123' -> 'asa.dasilva.abc123@example.com' (unique per booking)."""
    local = ".".join(_ascii_word(part) for part in (first, last, reference))
    return f"{local}@{CONTACT_DOMAIN}"


def _ascii_word(text: str) -> str:
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return "".join(ch for ch in folded.lower() if ch.isalnum())


#: Test cards by the reference's first letters (Stripe's test payment methods).
_CARDS_BY_PREFIX = {"DEC": "pm_card_chargeDeclined", "STL": "pm_card_chargeDeclinedStolenCard"}


def _payment_method(reference: str) -> str:
    return _CARDS_BY_PREFIX.get(reference[:3], "pm_card_visa")


def _seat(rng: random.Random) -> str:
    return f"{rng.randint(1, 40)}{rng.choice(SEAT_LETTERS)}"


def _known_reference(store: Store, reference: Any) -> str:
    """The upper-cased reference, or a 404 (not stored: nothing executed) if no such booking."""
    if not isinstance(reference, str) or not REFERENCE.fullmatch(reference):
        raise Invalid(partner_error(404, "booking_not_found", f"no booking {reference!r}"))
    if faults.is_unknown_booking(store, reference):
        raise Invalid(partner_error(404, "booking_not_found", f"no booking {reference!r}"))
    return reference.upper()


def get_booking(store: Store, reference: str, *, today: date) -> Response:
    ref = _known_reference(store, reference)
    return Response(
        status=200, body={**booking(ref, today=today), "seat_held": seat_held(store, ref)}
    )


# --- the schedule -----------------------------------------------------------------------------
#: How far ahead the airline sells seats (days after today, by the airline's clock).
HORIZON_DAYS = 330
#: How many days after the airline's today a booking's flight leaves (before moving to a day
#: its flight flies, at most 6 later): a week's notice at least, and inside the horizon.
BOOKED_DAYS_AHEAD = (7, HORIZON_DAYS - 6)
#: Skyways' own flights, numbered as bookings are (SK100 to SK9999); no other airline's fly here.
SKYWAYS_FLIGHT = re.compile(r"SK[1-9][0-9]{2,3}")


def operating_weekdays(flight: str) -> frozenset[int]:
    """The weekdays (Monday is 0) a flight flies: six of the seven for a Skyways flight, the
    day off seeded by the flight number's hash (as a booking is by its reference); none else."""
    if not SKYWAYS_FLIGHT.fullmatch(flight):
        return frozenset()
    rng = random.Random(hashlib.sha256(flight.encode()).hexdigest())
    return frozenset(rng.sample(range(7), 6))


def operates(flight: str, day: date) -> bool:
    """Whether `flight` is in the timetable on `day`, whatever the day's distance from today."""
    return day.weekday() in operating_weekdays(flight)


def next_operating_day(flight: str, day: date) -> date:
    """`day`, or the first day after it on which `flight` flies (`day` itself if it never does)."""
    for ahead in range(7):
        if operates(flight, day + timedelta(days=ahead)):
            return day + timedelta(days=ahead)
    return day


def schedule_answer(flight: str, day: date, *, today: date) -> dict[str, Any]:
    """Whether seats on `flight` on `day` can be sold today, and if not why: `past`,
    `beyond_horizon` (more than HORIZON_DAYS ahead) or `not_operating` (no such flight that day)."""
    if day < today:
        reason = "past"
    elif day > today + timedelta(days=HORIZON_DAYS):
        reason = "beyond_horizon"
    elif not operates(flight, day):
        reason = "not_operating"
    else:
        reason = ""
    return {
        "flight": flight,
        "date": day.isoformat(),
        "operates": not reason,
        "reason": reason,
        "horizon_days": HORIZON_DAYS,
        "last_bookable_date": (today + timedelta(days=HORIZON_DAYS)).isoformat(),
    }


def get_schedule(request: Request, *, today: date) -> Response:
    """`GET /airline/schedule?flight=SK1240&date=…`: whether that flight flies then."""
    flight = request.query.get("flight", "").strip().upper()
    try:
        day = date.fromisoformat(request.query.get("date", ""))
    except ValueError:
        raise Invalid(partner_error(400, "invalid_request", "date must be YYYY-MM-DD")) from None
    if not flight:
        raise Invalid(partner_error(400, "invalid_request", "flight is required"))
    return Response(status=200, body=schedule_answer(flight, day, today=today))


def injected(status: int) -> Response:
    return partner_error(status, "injected_fault", f"Injected sandbox fault ({status}).")


def _string(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise Invalid(partner_error(400, "invalid_request", f"{name} is required (a string)"))
    return value


def cancel_seat(store: Store, reference: str) -> Effect:
    """The seat-cancel effect for one booking (its reference is part of the compared params)."""

    def parse(request: Request) -> dict[str, Any]:
        body = request.json()
        _string(body, "workflow_id")
        return {**body, "reference": _known_reference(store, reference)}

    def execute(db: sqlite3.Connection, params: dict[str, Any], key: str | None) -> Response:
        answer = {
            "cancellation_id": f"sc_{secrets.token_hex(12)}",
            "reference": params["reference"],
            "seat": _undated(params["reference"])["seat"],
            "status": "released",
        }
        add_effect(
            db,
            kind="seat_cancellation",
            id=answer["cancellation_id"],
            idempotency_key=key,
            workflow_id=params["workflow_id"],
            subject=params["reference"],
            body=answer,
        )
        return Response(status=200, body=answer)

    return Effect(
        name="airline.cancel_seat",
        scope="airline",
        key_required=True,
        parse=parse,
        execute=execute,
        injected=injected,
    )


def boarding_pass(store: Store) -> Effect:
    """The boarding-pass effect: a new seat on the given flight and date."""

    def parse(request: Request) -> dict[str, Any]:
        body = request.json()
        for name in ("flight", "date", "workflow_id"):
            _string(body, name)
        try:
            date.fromisoformat(body["date"])
        except ValueError:
            raise Invalid(
                partner_error(400, "invalid_request", "date must be YYYY-MM-DD")
            ) from None
        return {**body, "reference": _known_reference(store, body.get("reference"))}

    def execute(db: sqlite3.Connection, params: dict[str, Any], key: str | None) -> Response:
        pass_id = f"bp_{secrets.token_hex(12)}"
        old_seat = _undated(params["reference"])["seat"]
        rng = random.Random(pass_id)
        seat = _seat(rng)
        while seat == old_seat:
            seat = _seat(rng)
        answer = {
            "boarding_pass_id": pass_id,
            "reference": params["reference"],
            "flight": params["flight"],
            "date": params["date"],
            "seat": seat,
            "barcode": "M1" + hashlib.sha256(pass_id.encode()).hexdigest()[:30].upper(),
        }
        add_effect(
            db,
            kind="boarding_pass",
            id=pass_id,
            idempotency_key=key,
            workflow_id=params["workflow_id"],
            subject=params["reference"],
            body=answer,
        )
        return Response(status=200, body=answer)

    return Effect(
        name="airline.boarding_pass",
        scope="airline",
        key_required=True,
        parse=parse,
        execute=execute,
        injected=injected,
    )


def seat_held(store: Store, reference: str) -> bool:
    """Whether the booking still holds its seat: every cancellation of it was reinstated."""
    released = store.select(
        "SELECT id FROM effects WHERE kind = 'seat_cancellation' AND subject = ?", (reference,)
    )
    reinstated = {
        row["cancellation_id"]
        for row in store.select(
            "SELECT json_extract(body, '$.cancellation_id') AS cancellation_id FROM effects"
            " WHERE kind = 'seat_reinstatement' AND subject = ?",
            (reference,),
        )
    }
    return all(row["id"] in reinstated for row in released)


def reinstate_seat(store: Store, reference: str) -> Effect:
    """Give a released seat back to its booking (undoing `cancel_seat` after a failed change).

    Idempotent by key like every effect, and by cancellation too: a cancellation already
    reinstated answers with that reinstatement, so the seat is never given back twice.
    """

    def parse(request: Request) -> dict[str, Any]:
        body = request.json()
        _string(body, "workflow_id")
        _string(body, "cancellation_id")
        return {**body, "reference": _known_reference(store, reference)}

    def execute(db: sqlite3.Connection, params: dict[str, Any], key: str | None) -> Response:
        cancelled = db.execute(
            "SELECT body FROM effects WHERE kind = 'seat_cancellation' AND id = ? AND subject = ?",
            (params["cancellation_id"], params["reference"]),
        ).fetchone()
        if cancelled is None:
            return partner_error(
                404, "cancellation_not_found", f"no seat cancellation {params['cancellation_id']}"
            )
        earlier = db.execute(
            "SELECT body FROM effects WHERE kind = 'seat_reinstatement'"
            " AND json_extract(body, '$.cancellation_id') = ?",
            (params["cancellation_id"],),
        ).fetchone()
        if earlier is not None:
            return Response(status=200, body=json.loads(earlier["body"]))
        answer = {
            "reinstatement_id": f"sr_{secrets.token_hex(12)}",
            "cancellation_id": params["cancellation_id"],
            "reference": params["reference"],
            "seat": json.loads(cancelled["body"])["seat"],
            "status": "held",
        }
        add_effect(
            db,
            kind="seat_reinstatement",
            id=answer["reinstatement_id"],
            idempotency_key=key,
            workflow_id=params["workflow_id"],
            subject=params["reference"],
            body=answer,
        )
        return Response(status=200, body=answer)

    return Effect(
        name="airline.reinstate_seat",
        scope="airline",
        key_required=True,
        parse=parse,
        execute=execute,
        injected=injected,
    )
