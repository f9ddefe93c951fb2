"""The sandbox's rules in-process: Stripe form decoding, booking derivation, idempotency."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
import time_machine

from refunds.sandbox import airline, faults
from refunds.sandbox.messages import Request
from refunds.sandbox.server import Sandbox
from refunds.sandbox.state import Store
from refunds.sandbox.stripe_syntax import decode_form, parse_query

#: The airline's today for the functions given one, and the clock frozen at its noon for the
#: sandbox that reads it (a Tuesday; no test here reads the real date).
TODAY = date(2026, 12, 1)
NOON = datetime(2026, 12, 1, 12, tzinfo=UTC)


def test_decode_form__nests_brackets_and_builds_lists():
    raw = (
        "amount=4500&metadata[workflow_id]=wf-1&metadata[step]=charge"
        "&expand[0]=latest_charge&expand[1]=customer&items[]=a&items[]=b"
        "&automatic_payment_methods[enabled]=true"
    )

    assert decode_form(raw) == {
        "amount": "4500",
        "metadata": {"workflow_id": "wf-1", "step": "charge"},
        "expand": ["latest_charge", "customer"],
        "items": ["a", "b"],
        "automatic_payment_methods": {"enabled": "true"},
    }


def test_booking__same_reference_same_booking_in_any_case():
    def booking(reference: str) -> dict:
        return airline.booking(reference, today=TODAY)

    assert booking("abc123") == booking("ABC123")
    assert booking("ABC123") != booking("ABC124")
    assert booking("F00000")["fare_class"] == "flex"
    assert booking("B00000")["fare_class"] == "basic"
    assert booking("DECAAA")["payment_method"] == "pm_card_chargeDeclined"


def _post(app: Sandbox, path: str, body: dict, key: str) -> tuple[int, dict, dict]:
    request = Request(
        method="POST",
        path=path,
        query={},
        headers={"idempotency-key": key, "content-type": "application/json"},
        body=json.dumps(body).encode(),
    )
    response = app.handle(request)
    return response.status, response.body, response.headers


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Sandbox]:
    store = Store(tmp_path / "state.sqlite3")
    yield Sandbox(store, key_window_seconds=86400)
    store.close()


def test_run_effect__racing_threads_with_one_key_execute_once(app):
    body = {"customer_email": "a@b.test", "reference": "ABC123", "workflow_id": "wf"}
    faults.configure(app.store, {"endpoint": "crm.update", "latency_ms": 200, "count": 1})
    answers: list[tuple[int, dict, dict]] = []
    threads = [
        threading.Thread(target=lambda: answers.append(_post(app, "/crm/updates", body, "k")))
        for _ in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    statuses = sorted(status for status, _, _ in answers)
    assert statuses.count(200) >= 1 and set(statuses) <= {200, 409}
    assert len({b["update_id"] for s, b, _ in answers if s == 200}) == 1
    assert len(app.store.select("SELECT * FROM effects")) == 1


def test_store__a_key_left_in_flight_by_a_crash_is_freed_on_open(tmp_path: Path):
    store = Store(tmp_path / "state.sqlite3")
    with store.transaction() as db:
        db.execute(
            "INSERT INTO idempotency_keys (scope, key, fingerprint, created)"
            " VALUES ('crm', 'k', 'f', 0)"
        )
    store.close()

    reopened = Store(tmp_path / "state.sqlite3")

    assert reopened.select("SELECT * FROM idempotency_keys") == []
    reopened.close()


def test_parse_query__metadata_clauses_with_escaped_quotes_and_and():
    query = (
        r"metadata['idempotency_key']:'wf AND x\'s:charge' AND status:'succeeded' AND amount:4500"
    )

    assert parse_query(query) == [
        ("idempotency_key", None, "wf AND x's:charge"),
        (None, "status", "succeeded"),
        (None, "amount", "4500"),
    ]


@pytest.mark.parametrize("query", ["customer:'cus_1'", "metadata['a']:'b' OR status:'x'", "a b"])
def test_parse_query__rejects_what_the_sandbox_cannot_search(query):
    with pytest.raises(ValueError):
        parse_query(query)


# --- the airline's schedule -------------------------------------------------------------------


def test_schedule__a_skyways_flight_flies_six_weekdays_seeded_by_its_number():
    assert airline.operating_weekdays("SK1240") == airline.operating_weekdays("SK1240")
    assert len(airline.operating_weekdays("SK1240")) == 6
    days_off = {
        flight: set(range(7)) - airline.operating_weekdays(flight)
        for flight in ("SK1240", "SK1234", "SK900", "SK77")
    }
    assert days_off["SK77"] == set(range(7))  # not a Skyways number: never flies
    assert len({frozenset(days) for days in days_off.values()}) > 1  # not one day off for all


def test_schedule__other_airlines_flights_do_not_fly_here():
    assert airline.operating_weekdays("ZZ9999") == frozenset()
    assert not airline.operates("LH400", TODAY + timedelta(weeks=15))  # a Tuesday


@pytest.mark.parametrize(
    ("flight", "days_ahead", "reason"),
    [
        ("SK1240", 7 * 15, ""),  # a Tuesday
        ("SK1240", -1, "past"),
        ("ZZ9999", -10_000, "past"),
        ("SK1234", airline.HORIZON_DAYS, ""),  # the 330th day ahead is still sold
        ("SK1234", airline.HORIZON_DAYS + 1, "beyond_horizon"),
        ("SK1240", 7 * 15 + 1, "not_operating"),  # a Wednesday, SK1240's day off
        ("ZZ9999", 7 * 15, "not_operating"),
    ],
)
def test_schedule_answer__past_beyond_the_horizon_or_not_flying(flight, days_ahead, reason):
    day = TODAY + timedelta(days=days_ahead)

    answer = airline.schedule_answer(flight, day, today=TODAY)

    assert (answer["operates"], answer["reason"]) == (not reason, reason)
    assert answer["last_bookable_date"] == (TODAY + timedelta(days=330)).isoformat()


#: References as customers type them: every fare, and a few hundred more.
REFERENCES = ["ABC123", "MKR123", "XYZ789", "QX7K2M", "F00000", "DECAAA"] + [
    f"R{n:05d}" for n in range(300)
]


@pytest.mark.parametrize("today", [TODAY, TODAY + timedelta(days=365), date(2031, 2, 28)])
def test_booking__lives_in_the_airline_s_calendar_on_any_day(today: date) -> None:
    """Every booking is one the airline sells on its today: a week ahead at least, inside the
    horizon, on a day its flight flies."""
    for reference in REFERENCES:
        booked = airline.booking(reference, today=today)
        day = date.fromisoformat(booked["date"])

        assert airline.schedule_answer(booked["flight"], day, today=today)["operates"], booked
        assert day >= today + timedelta(days=7), booked


def test_booking__the_same_on_a_given_day_and_only_its_date_moves_with_the_calendar() -> None:
    later = TODAY + timedelta(days=365)
    for reference in REFERENCES:
        now, again, then = (airline.booking(reference, today=day) for day in (TODAY, TODAY, later))
        moved = (date.fromisoformat(then["date"]) - date.fromisoformat(now["date"])).days

        assert now == again
        assert {**then, "date": now["date"]} == now  # passenger, flight, seat: all the same
        assert 365 - 6 <= moved <= 365 + 6  # as far ahead of its today (then a day it flies)


def test_owner_of__the_booking_s_passenger_and_contact_on_any_day() -> None:
    booked = airline.booking("QX7K2M", today=TODAY + timedelta(days=1000))

    owner = airline.owner_of("QX7K2M")

    assert (owner.last_name, owner.email) == (
        booked["passenger"]["last_name"],
        booked["contact_email"],
    )


# --- the sandbox's today: the clock's, moved by its offset --------------------------------------
def _get(app: Sandbox, path: str, **query: str) -> dict:
    request = Request(method="GET", path=path, query=query, headers={}, body=b"")
    response = app.handle(request)
    assert response.status == 200, response.body
    return response.body


def _last_bookable(app: Sandbox) -> date:
    answer = _get(app, "/airline/schedule", flight="SK1240", date=TODAY.isoformat())
    return date.fromisoformat(answer["last_bookable_date"])


@pytest.mark.parametrize("offset_days", [0, 365])
def test_sandbox_today__the_utc_date_moved_by_its_offset(tmp_path: Path, offset_days: int):
    store = Store(tmp_path / "state.sqlite3")
    try:
        app = Sandbox(store, key_window_seconds=86400, today_offset_days=offset_days)
        with time_machine.travel(NOON + timedelta(hours=11, minutes=59), tick=False):
            today = TODAY + timedelta(days=offset_days)
            booked = _get(app, "/airline/bookings/QX7K2M")

            assert app.today() == today
            assert _last_bookable(app) == today + timedelta(days=airline.HORIZON_DAYS)
            assert booked == {**airline.booking("QX7K2M", today=today), "seat_held": True}
        with time_machine.travel(NOON + timedelta(hours=12, minutes=1), tick=False):
            assert app.today() == today + timedelta(days=1)  # UTC's midnight, wherever it runs
    finally:
        store.close()


def test_sandbox_today__moved_a_year_by_the_clock_as_by_the_offset(tmp_path: Path):
    store = Store(tmp_path / "state.sqlite3")
    try:
        ahead = Sandbox(store, key_window_seconds=86400, today_offset_days=365)
        plain = Sandbox(store, key_window_seconds=86400)
        with time_machine.travel(NOON, tick=False):
            by_offset = (_last_bookable(ahead), _get(ahead, "/airline/bookings/ABC123"))
        with time_machine.travel(NOON + timedelta(days=365), tick=False):
            by_clock = (_last_bookable(plain), _get(plain, "/airline/bookings/ABC123"))

        assert by_offset == by_clock
    finally:
        store.close()
