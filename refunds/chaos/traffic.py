"""Customers for a chaos run: refund requests sent through the real form, as a browser would.

Each customer GETs `/refunds/new/` (CSRF cookie and one-time submission token), then POSTs it
back and follows nothing: the 303's Location names the refund. Some customers double-submit the
same rendered form, one click after the other or both at once, which must yield one refund.
While the database is down (a chaos run restarts or stops it) a page answers 503 (or fails), and
the customer loads it again or sends the same form again, token and all, until it goes through.
"""

from __future__ import annotations

import random
import re
import string
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from html.parser import HTMLParser
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connections
from django.test import Client

from refunds.models import RefundRequest
from refunds.privacy import email_digest
from refunds.sandbox.airline import next_operating_day, owner_of

FORM_URL = "/refunds/new/"
_STATUS_URL = re.compile(r"/refunds/(?P<public_id>rf_[A-Za-z0-9_-]+)/$")
_FIRST = [c for c in string.ascii_uppercase if c not in "FBD"]  # F flex, B basic, DEC declines
_REST = string.ascii_uppercase + string.digits
T = TypeVar("T")
#: How long a customer keeps trying while the database is down, beyond the outage itself.
DATABASE_PATIENCE_SECONDS = 60.0
_MESSAGES = (
    "Hi, something came up at work. Could you move me to flight {flight} on {day}? Thanks!",
    "Please rebook me onto {flight} on {day} instead, my meeting moved.",
    "I need to change my flight to a later one: {flight}, {day}. Happy to pay the fee.",
    "Can I switch to flight {flight} on {day}? Family emergency, sorry for the short notice.",
    "Hello, I'd like to reschedule to {flight} on {day}. Window seat if possible.",
    # Neither flight nor day: the run keeps the booking's own, so its date must be one the
    # airline sells (the sandbox's bookings live in its calendar).
    "Could I have another seat on the flight I'm booked on? Happy to pay the fee.",
)


@dataclass(frozen=True, kw_only=True)
class Customer:
    email: str
    booking_reference: str
    last_name: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Submission:
    customer: Customer
    public_id: str
    workflow_id: str
    #: None for a single submit; for a double submit, whether both landed on one refund.
    same_refund: bool | None = None
    error: str = ""
    #: Page loads and form sends repeated because the database did not answer.
    database_retries: int = 0


def customers(rng: random.Random, count: int, *, today: date) -> list[Customer]:
    """Distinct standard-fare references, each sent by its owner (the passenger's last name
    and the booking's contact e-mail, as the sandbox derives them), asking for a day the
    airline sells on its `today` or for their own flight again, so every refund should
    complete."""
    references: set[str] = set()
    while len(references) < count:
        tail = "".join(rng.choice(_REST) for _ in range(4))
        references.add(rng.choice(_FIRST) + rng.choice(string.digits) + tail)
    result = []
    for reference in sorted(references):
        flight = f"SK{rng.randint(100, 9999)}"
        # A day that flight flies (the airline's schedule refuses any other).
        day = next_operating_day(flight, today + timedelta(days=rng.randint(14, 200)))
        message = rng.choice(_MESSAGES).format(flight=flight, day=day.strftime("%-d %B %Y"))
        owner = owner_of(reference)
        result.append(
            Customer(
                email=owner.email,
                booking_reference=reference,
                last_name=owner.last_name,
                message=message,
            )
        )
    rng.shuffle(result)
    return result


class HiddenInputs(HTMLParser):
    """Every hidden input of the page (CSRF token, submission token): posted back untouched."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "input" and found.get("type") == "hidden" and found.get("name"):
            self.values[str(found["name"])] = found.get("value") or ""


def submit(customer: Customer, *, double: str = "", outage_seconds: float = 0.0) -> Submission:
    """One customer's visit; `double` is "", "sequential" or "concurrent"; `outage_seconds`:
    how long the database may be down, which the customer waits out."""
    client = Client(enforce_csrf_checks=True)
    patiently = _Patience(DATABASE_PATIENCE_SECONDS + outage_seconds)
    page = patiently(lambda: client.get(FORM_URL))
    if page.status_code != 200:
        return _failed(customer, f"GET {FORM_URL} answered {page.status_code}")
    hidden = HiddenInputs()
    hidden.feed(page.content.decode())
    data = {
        **hidden.values,
        "email": customer.email,
        "booking_reference": customer.booking_reference,
        "last_name": customer.last_name,
        "message": customer.message,
    }
    earlier = patiently(lambda: set(_requests_of(customer)))  # a reused database's, or none
    if double == "concurrent":
        locations = _post_concurrently(client, data, patiently)
    else:
        locations = [_post(client, data, patiently) for _ in range(2 if double else 1)]
    public_ids = {_public_id(location) for location in locations}
    if len(public_ids) != 1 or None in public_ids:
        return _failed(customer, f"POST answered {locations}", same=False if double else None)
    public_id = str(public_ids.pop())
    if public_id in earlier:
        return _failed(
            customer,
            f"the form answered with {public_id}, a request made before this run (the same "
            "words within the resubmit window are the same request)",
            same=False if double else None,
        )
    ids = {
        made: workflow_id
        for made, workflow_id in patiently(lambda: _requests_of(customer)).items()
        if made not in earlier
    }
    return Submission(
        customer=customer,
        public_id=public_id,
        workflow_id=ids.get(public_id) or "",
        same_refund=(set(ids) == {public_id}) if double else None,
        database_retries=patiently.retries,
    )


def _requests_of(customer: Customer) -> dict[str, str | None]:
    """The customer's refund requests: public id -> workflow id."""
    return dict(
        RefundRequest.objects.filter(email_digest=email_digest(customer.email)).values_list(
            "public_id", "workflow_id"
        )
    )


def _post(client: Client, data: dict[str, str], patiently: _Patience) -> str:
    response = patiently(lambda: client.post(FORM_URL, data))
    if response.status_code != 303:
        return f"HTTP {response.status_code}"
    return str(response["Location"])


def _post_concurrently(client: Client, data: dict[str, str], patiently: _Patience) -> list[str]:
    """A double click that races: two requests of one browser (same cookies) at the same time."""
    results: list[str] = ["", ""]
    barrier = threading.Barrier(2)

    def click(slot: int) -> None:
        twin = Client(enforce_csrf_checks=True)
        twin.cookies.update(client.cookies)  # the same browser: one session, one CSRF cookie
        try:
            barrier.wait(timeout=10)
            results[slot] = _post(twin, data, patiently)
        except Exception as exc:
            results[slot] = f"{type(exc).__name__}: {exc}"
        finally:
            connections.close_all()  # this thread's own database connection

    threads = [threading.Thread(target=click, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


class _Patience:
    """Runs an action again while the database does not answer (a 503 page, or this process's
    own query failing), as a customer would reload the page or send the form again; counts how
    often it had to."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.retries = 0

    def __call__(self, action: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.seconds
        while True:
            try:
                result = action()
            except (OperationalError, InterfaceError):
                connections.close_all()  # this thread's dead connection; the next try opens one
                if time.monotonic() > deadline:
                    raise
            else:
                if getattr(result, "status_code", None) != 503 or time.monotonic() > deadline:
                    return result
                # A server closes a connection its request found broken once the request ends;
                # the test client leaves that to its caller.
                connections.close_all()
            self.retries += 1
            time.sleep(0.2)  # a customer's reload, not a wait for an event


def _public_id(location: str) -> str | None:
    match = _STATUS_URL.search(location)
    return match.group("public_id") if match else None


def _failed(customer: Customer, error: str, *, same: bool | None = None) -> Submission:
    return Submission(
        customer=customer, public_id="", workflow_id="", same_refund=same, error=error
    )
