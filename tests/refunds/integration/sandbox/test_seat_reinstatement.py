"""The airline's seat reinstatement: a released seat given back, once, and the booking shows it."""

from __future__ import annotations

import requests


def _post(sandbox, path: str, body: dict, key: str) -> requests.Response:
    return requests.post(
        f"{sandbox.url}{path}", json=body, headers={"Idempotency-Key": key}, timeout=10
    )


def _held(sandbox, reference: str) -> bool:
    booking = requests.get(f"{sandbox.url}/airline/bookings/{reference}", timeout=10)
    return booking.json()["seat_held"]


def test_reinstate_seat__gives_the_seat_back_once(clean_sandbox):
    assert _held(clean_sandbox, "RNS123") is True
    released = _post(
        clean_sandbox, "/airline/bookings/RNS123/cancel-seat", {"workflow_id": "wf-r"}, "k-cancel"
    ).json()
    assert _held(clean_sandbox, "RNS123") is False
    body = {"workflow_id": "wf-r", "cancellation_id": released["cancellation_id"]}

    first = _post(clean_sandbox, "/airline/bookings/RNS123/reinstate-seat", body, "k-back")
    replay = _post(clean_sandbox, "/airline/bookings/RNS123/reinstate-seat", body, "k-back")
    other_key = _post(clean_sandbox, "/airline/bookings/RNS123/reinstate-seat", body, "k-other")

    assert first.status_code == 200 and first.json()["seat"] == released["seat"]
    assert replay.json() == first.json() == other_key.json()  # one reinstatement, whatever key
    assert _held(clean_sandbox, "RNS123") is True
    ledger = clean_sandbox.ledger(workflow_id="wf-r")
    assert [
        (r["idempotency_key"], r["cancellation_id"]) for r in ledger["seat_reinstatements"]
    ] == [("k-back", released["cancellation_id"])]


def test_reinstate_seat__of_an_unknown_cancellation_is_refused(clean_sandbox):
    answer = _post(
        clean_sandbox,
        "/airline/bookings/RNS124/reinstate-seat",
        {"workflow_id": "wf-r", "cancellation_id": "sc_nope"},
        "k-unknown",
    )

    assert answer.status_code == 404
    assert clean_sandbox.ledger()["seat_reinstatements"] == []


def test_reinstatement__found_by_its_key(clean_sandbox):
    released = _post(
        clean_sandbox, "/airline/bookings/RNS125/cancel-seat", {"workflow_id": "wf-r"}, "k-c2"
    ).json()
    _post(
        clean_sandbox,
        "/airline/bookings/RNS125/reinstate-seat",
        {"workflow_id": "wf-r", "cancellation_id": released["cancellation_id"]},
        "k-b2",
    )

    found = requests.get(
        f"{clean_sandbox.url}/airline/seat-reinstatements",
        params={"idempotency_key": "k-b2"},
        timeout=10,
    ).json()["data"]
    missing = requests.get(
        f"{clean_sandbox.url}/airline/seat-reinstatements",
        params={"idempotency_key": "k-none"},
        timeout=10,
    ).json()["data"]

    assert [r["cancellation_id"] for r in found] == [released["cancellation_id"]]
    assert missing == []
