"""The sandbox's rules in-process: Stripe form decoding, booking derivation, idempotency."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from refunds.sandbox import airline, faults
from refunds.sandbox.messages import Request
from refunds.sandbox.server import Sandbox
from refunds.sandbox.state import Store
from refunds.sandbox.stripe_syntax import decode_form, parse_query


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
    assert airline.booking("abc123") == airline.booking("ABC123")
    assert airline.booking("ABC123") != airline.booking("ABC124")
    assert airline.booking("F00000")["fare_class"] == "flex"
    assert airline.booking("B00000")["fare_class"] == "basic"
    assert airline.booking("DECAAA")["payment_method"] == "pm_card_chargeDeclined"


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
TODAY = airline.date(2026, 12, 1)


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
    assert not airline.operates("LH400", airline.date(2027, 3, 16))


@pytest.mark.parametrize(
    ("flight", "day", "reason"),
    [
        ("SK1240", "2027-03-16", ""),
        ("SK1240", "2026-11-30", "past"),
        ("ZZ9999", "1999-01-01", "past"),
        ("SK1234", "2027-10-27", ""),  # the 330th day ahead is still sold
        ("SK1234", "2027-10-28", "beyond_horizon"),
        ("SK1240", "2027-03-17", "not_operating"),  # a Wednesday, SK1240's day off
        ("ZZ9999", "2027-03-16", "not_operating"),
    ],
)
def test_schedule_answer__past_beyond_the_horizon_or_not_flying(flight, day, reason):
    answer = airline.schedule_answer(flight, airline.date.fromisoformat(day), today=TODAY)

    assert (answer["operates"], answer["reason"]) == (not reason, reason)
    assert answer["last_bookable_date"] == "2027-10-27"


def test_booking__its_own_flight_flies_on_its_own_date():
    for reference in ("ABC123", "MKR123", "XYZ789", "QX7K2M", "F00000", "DECAAA"):
        booked = airline.booking(reference)
        assert airline.operates(booked["flight"], airline.date.fromisoformat(booked["date"]))
