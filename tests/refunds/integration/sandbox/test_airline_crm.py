"""The airline and CRM partners: deterministic bookings, idempotent effects, keys required."""

from __future__ import annotations

import re
from datetime import date, timedelta

import pytest
import requests

from refunds.sandbox.airline import BOOKED_DAYS_AHEAD, HORIZON_DAYS, operates
from tests.support.airline_days import airline_today, new_flight


def _get(sandbox, reference: str) -> requests.Response:
    return requests.get(f"{sandbox.url}/airline/bookings/{reference}", timeout=10)


def _post(sandbox, path: str, body: dict, key: str | None) -> requests.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return requests.post(f"{sandbox.url}{path}", json=body, headers=headers, timeout=10)


def test_booking__derived_deterministically_from_reference(clean_sandbox):
    first, again, lower = (
        _get(clean_sandbox, "QX7K2M"),
        _get(clean_sandbox, "QX7K2M"),
        _get(clean_sandbox, "qx7k2m"),
    )

    booking = first.json()
    assert first.status_code == 200
    assert booking == again.json() == lower.json()
    assert booking["reference"] == "QX7K2M"
    assert re.fullmatch(r"SK\d{3,4}", booking["flight"])
    day = date.fromisoformat(booking["date"])  # in the airline's calendar: sold, and flying
    assert airline_today() + timedelta(days=BOOKED_DAYS_AHEAD[0]) <= day
    assert day <= airline_today() + timedelta(days=HORIZON_DAYS)
    assert operates(booking["flight"], day)
    assert re.fullmatch(r"\d{1,2}[A-F]", booking["seat"])
    assert booking["origin"] != booking["destination"]
    assert booking["passenger"]["name"] and booking["status"] == "confirmed"
    assert (booking["fare_class"], booking["payment_method"]) == ("standard", "pm_card_visa")
    assert _get(clean_sandbox, "QX7K2N").json() != booking


@pytest.mark.parametrize(
    ("reference", "fare_class", "payment_method"),
    [
        ("FLX123", "flex", "pm_card_visa"),
        ("BAS123", "basic", "pm_card_visa"),
        ("DEC123", "standard", "pm_card_chargeDeclined"),
        ("dec999", "standard", "pm_card_chargeDeclined"),
        ("A1B2C3", "standard", "pm_card_visa"),
    ],
)
def test_booking__fare_class_and_payment_method_follow_the_prefix(
    sandbox, reference, fare_class, payment_method
):
    booking = _get(sandbox, reference).json()

    assert (booking["fare_class"], booking["payment_method"]) == (fare_class, payment_method)


@pytest.mark.parametrize("reference", ["ABC12", "ABCDEFG", "AB-123", "AB%2012"])
def test_booking__malformed_reference_is_not_found(sandbox, reference):
    answer = _get(sandbox, reference)

    assert answer.status_code == 404
    assert answer.json()["error"] == "booking_not_found"


def test_booking__unknown_bookings_fault_makes_it_404_until_cleared(clean_sandbox):
    clean_sandbox.set_fault(unknown_bookings=["GON123"])
    body = {"workflow_id": "wf-gone"}

    assert _get(clean_sandbox, "gon123").status_code == 404
    assert (
        _post(clean_sandbox, "/airline/bookings/GON123/cancel-seat", body, "k").status_code == 404
    )
    assert clean_sandbox.ledger()["seat_cancellations"] == []
    clean_sandbox.clear_faults()
    assert _get(clean_sandbox, "GON123").status_code == 200
    # The 404 was not stored for the key: the same key now executes.
    assert (
        _post(clean_sandbox, "/airline/bookings/GON123/cancel-seat", body, "k").status_code == 200
    )


def test_cancel_seat__same_key_replays_one_cancellation(clean_sandbox):
    path, body = "/airline/bookings/ABC123/cancel-seat", {"workflow_id": "wf-seat"}

    first = _post(clean_sandbox, path, body, "seat-1")
    again = _post(clean_sandbox, path, body, "seat-1")

    assert first.status_code == again.status_code == 200
    assert first.json()["cancellation_id"].startswith("sc_")
    assert first.json()["seat"] == _get(clean_sandbox, "ABC123").json()["seat"]
    assert first.json()["status"] == "released"
    assert again.json() == first.json()
    assert again.headers["Idempotent-Replayed"] == "true"
    entries = clean_sandbox.ledger(workflow_id="wf-seat")["seat_cancellations"]
    assert [(e["id"], e["idempotency_key"]) for e in entries] == [
        (first.json()["cancellation_id"], "seat-1")
    ]


def test_cancel_seat__same_key_other_booking_is_idempotency_error(clean_sandbox):
    body = {"workflow_id": "wf-seat"}
    _post(clean_sandbox, "/airline/bookings/ABC123/cancel-seat", body, "seat-2")

    other = _post(clean_sandbox, "/airline/bookings/XYZ789/cancel-seat", body, "seat-2")

    assert other.status_code == 400
    assert other.json()["error"]["type"] == "idempotency_error"


def test_boarding_pass__new_seat_replayed_for_the_same_key(clean_sandbox):
    booking = _get(clean_sandbox, "ABC123").json()
    new = new_flight("SK1234")
    body = {"reference": "ABC123", "flight": "SK1234", "date": new.date, "workflow_id": "wf-bp"}

    first = _post(clean_sandbox, "/airline/boarding-passes", body, "bp-1")
    again = _post(clean_sandbox, "/airline/boarding-passes", body, "bp-1")

    issued = first.json()
    assert first.status_code == 200 and issued["boarding_pass_id"].startswith("bp_")
    assert (issued["reference"], issued["flight"], issued["date"]) == (
        "ABC123",
        "SK1234",
        new.date,
    )
    assert issued["seat"] != booking["seat"] and issued["barcode"]
    assert again.json() == issued and again.headers["Idempotent-Replayed"] == "true"
    assert len(clean_sandbox.ledger(workflow_id="wf-bp")["boarding_passes"]) == 1


def test_crm_update__same_key_replays_one_update(clean_sandbox):
    body = {
        "customer_email": "a@b.test",
        "reference": "ABC123",
        "workflow_id": "wf-crm",
        "note": "rebooked",
    }

    first = _post(clean_sandbox, "/crm/updates", body, "crm-1")
    again = _post(clean_sandbox, "/crm/updates", body, "crm-1")

    assert first.status_code == 200 and first.json()["update_id"].startswith("crm_")
    assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
    updates = clean_sandbox.ledger()["crm_updates"]
    assert [(u["idempotency_key"], u["workflow_id"]) for u in updates] == [("crm-1", "wf-crm")]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/airline/bookings/ABC123/cancel-seat", {"workflow_id": "wf"}),
        ("/airline/boarding-passes", {"reference": "ABC123", "workflow_id": "wf"}),
        (
            "/crm/updates",
            {"customer_email": "a@b.test", "reference": "ABC123", "workflow_id": "wf"},
        ),
    ],
)
def test_effects__without_key_are_rejected_and_not_executed(clean_sandbox, path, body):
    if path == "/airline/boarding-passes":  # a flight and day the airline sells: only the key lacks
        wanted = new_flight()
        body = {**body, "flight": wanted.flight, "date": wanted.date}
    answer = _post(clean_sandbox, path, body, None)

    assert answer.status_code == 400
    assert "Idempotency-Key header required" in answer.text
    ledger = clean_sandbox.ledger()
    assert ledger["seat_cancellations"] == ledger["boarding_passes"] == ledger["crm_updates"] == []


def test_effects__injected_error_then_retry_executes_once(clean_sandbox):
    clean_sandbox.set_fault(endpoint="crm.update", error_rate=1, count=1)
    body = {"customer_email": "a@b.test", "reference": "ABC123", "workflow_id": "wf-e"}

    failed = _post(clean_sandbox, "/crm/updates", body, "crm-e")
    retried = _post(clean_sandbox, "/crm/updates", body, "crm-e")

    assert failed.status_code == 500
    assert retried.status_code == 200 and retried.headers["Idempotent-Replayed"] == "false"
    assert len(clean_sandbox.ledger()["crm_updates"]) == 1
