"""The airline cancels a flight: it records the cancellation, keeps the flight's manifest, moves
its passengers to the same flight's next day it flies, and announces it to the refund service
with a signed notice (docs/refunds.md, "A cancelled flight").

The manifest is derived, as bookings are: passenger `i` of a flight on a day has a reference
seeded by (flight, day, i), on a standard fare (an `X` first: not basic, not a declined card),
so the same cancellation always lists the same passengers and each one's booking answers as
any other. The notice is signed the way the refund service verifies partner webhooks
(HMAC-SHA256 of "<t>.<body>"), here with the sandbox's own few lines: it shares no code with
the service it answers.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request
from datetime import date, timedelta
from typing import Any

from refunds.sandbox import airline
from refunds.sandbox.messages import Invalid, Request, Response, partner_error
from refunds.sandbox.state import Store

#: A cancelled flight's passengers unless told otherwise: the issue's full flight.
DEFAULT_PASSENGERS = 300
MAX_PASSENGERS = 1000
SIGNATURE_HEADER = "Agentflow-Signature"


def manifest_references(flight: str, day: date, passengers: int) -> list[str]:
    """The flight's passengers on `day`: `passengers` distinct six-character references."""
    found: list[str] = []
    index = 0
    while len(found) < passengers:
        digest = hashlib.sha256(f"{flight}:{day.isoformat()}:{index}".encode()).hexdigest()
        reference = f"X{digest[:5].upper()}"
        if reference not in found:
            found.append(reference)
        index += 1
    return found


def cancel_flight(store: Store, request: Request, *, today: date) -> Response:
    """`POST /_sandbox/airline/cancel-flight` `{flight, date, passengers?, notify_url?,
    secret?}`: cancel it (once: the same flight and day again is the same cancellation) and,
    given a URL and a secret, send the refund service the signed notice. Answers the notice
    and the refund service's status (None: not sent)."""
    body = request.json()
    flight = str(body.get("flight", "")).strip().upper()
    try:
        day = date.fromisoformat(str(body.get("date", "")))
    except ValueError:
        raise Invalid(partner_error(400, "invalid_request", "date must be YYYY-MM-DD")) from None
    passengers = body.get("passengers", DEFAULT_PASSENGERS)
    if not isinstance(passengers, int) or not 1 <= passengers <= MAX_PASSENGERS:
        raise Invalid(partner_error(400, "invalid_request", f"passengers is 1 to {MAX_PASSENGERS}"))
    answer = airline.schedule_answer(flight, day, today=today)
    if not answer["operates"]:
        why = answer["reason"] or "no such flight"
        raise Invalid(partner_error(400, "invalid_request", f"{flight} on {day}: {why}"))
    rebooked = airline.next_operating_day(flight, day + timedelta(days=1))
    with store.transaction() as db:
        db.execute(
            "INSERT OR IGNORE INTO cancelled_flights"
            " (flight, date, passengers, rebooked_date, created) VALUES (?, ?, ?, ?, ?)",
            (flight, day.isoformat(), passengers, rebooked.isoformat(), time.time()),
        )
    notice = _notice(store, flight, day)
    delivered = None
    url, secret = body.get("notify_url"), body.get("secret")
    if isinstance(url, str) and url and isinstance(secret, str) and secret:
        delivered = _announce(url, secret, notice)
    return Response(status=200, body={"notice": notice, "delivered": delivered})


def _notice(store: Store, flight: str, day: date) -> dict[str, Any]:
    [row] = store.select(
        "SELECT * FROM cancelled_flights WHERE flight = ? AND date = ?", (flight, day.isoformat())
    )
    return {
        "id": f"flight-cancelled:{flight}:{day.isoformat()}",
        "type": "flight.cancelled",
        "flight": flight,
        "date": day.isoformat(),
        "passengers": row["passengers"],
        "rebooked_to": {"flight": flight, "date": row["rebooked_date"]},
    }


def _announce(url: str, secret: str, notice: dict[str, Any]) -> int:
    """POST the signed notice; the refund service's HTTP status (0: it could not be reached)."""
    body = json.dumps(notice, sort_keys=True).encode()
    timestamp = int(time.time())
    signature = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            SIGNATURE_HEADER: f"t={timestamp},v1={signature.hexdigest()}",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)
    except OSError:
        return 0


def get_manifest(store: Store, request: Request) -> Response:
    """`GET /airline/manifest?flight=SK1236&date=…`: a cancelled flight's passengers (their
    reference, name and contact e-mail) and where they were moved; 404 for a flight that was
    not cancelled."""
    flight = request.query.get("flight", "").strip().upper()
    day = request.query.get("date", "")
    rows = store.select(
        "SELECT * FROM cancelled_flights WHERE flight = ? AND date = ?", (flight, day)
    )
    if not rows:
        raise Invalid(partner_error(404, "not_cancelled", f"{flight} on {day} is not cancelled"))
    row = rows[0]
    passengers = []
    for reference in manifest_references(flight, date.fromisoformat(day), row["passengers"]):
        owner = airline.owner_of(reference)
        passengers.append(
            {"reference": reference, "last_name": owner.last_name, "email": owner.email}
        )
    return Response(
        status=200,
        body={
            "flight": flight,
            "date": day,
            "status": "cancelled",
            "rebooked_to": {"flight": flight, "date": row["rebooked_date"]},
            "passengers": passengers,
        },
    )
