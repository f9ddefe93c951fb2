"""Asking the running sandbox airline to cancel a flight (`POST /_sandbox/airline/cancel-flight`)
and announce it to the refund service: the one way both `manage.py sandbox cancel-flight` and the
console's "Cancel a flight" page do it (docs/refunds.md, "A cancelled flight")."""

from __future__ import annotations

import requests
from django.conf import settings


class Refused(Exception):
    """Why the flight was not cancelled, or its notice not delivered, in words for the operator."""


def cancel_flight(flight: str, day: str, passengers: int) -> str:
    """Cancel `flight` on `day` (YYYY-MM-DD) in the sandbox at SANDBOX_URL, which sends its
    signed notice to REFUNDS_AIRLINE_NOTICES_URL; what happened, in one sentence, or Refused."""
    if not settings.REFUNDS_AIRLINE_SECRET:
        raise Refused("set REFUNDS_AIRLINE_SECRET: the refund service refuses unsigned notices")
    try:
        answer = requests.post(
            f"{settings.SANDBOX_URL.rstrip('/')}/_sandbox/airline/cancel-flight",
            json={
                "flight": flight,
                "date": day,
                "passengers": passengers,
                "notify_url": settings.REFUNDS_AIRLINE_NOTICES_URL,
                "secret": settings.REFUNDS_AIRLINE_SECRET,
            },
            timeout=30,
        )
    except requests.RequestException as exc:
        raise Refused(f"the sandbox at {settings.SANDBOX_URL} did not answer: {exc}") from None
    json_body = answer.headers.get("Content-Type", "").startswith("application/json")
    body = answer.json() if json_body else {}
    if answer.status_code != 200:
        raise Refused(f"the sandbox refused: {body.get('message') or answer.status_code}")
    notice, delivered = body["notice"], body["delivered"]
    if delivered != 200:
        raise Refused(
            f"{notice['flight']} on {notice['date']} is cancelled, but the refund service at "
            f"{settings.REFUNDS_AIRLINE_NOTICES_URL} answered {delivered or 'nothing'}"
        )
    return (
        f"{notice['flight']} on {notice['date']} cancelled: {notice['passengers']} passengers "
        f"moved to {notice['rebooked_to']['date']}; the refund service has the notice"
    )
