"""Customers for a chaos run: refund requests sent through the real form, as a browser would.

Each customer GETs `/refunds/new/` (CSRF cookie and one-time submission token), then POSTs it
back and follows nothing: the 303's Location names the refund. Some customers double-submit the
same rendered form, one click after the other or both at once, which must yield one refund.
"""

from __future__ import annotations

import random
import re
import string
import threading
from dataclasses import dataclass
from datetime import date, timedelta
from html.parser import HTMLParser

from django.db import connections
from django.test import Client

from refunds.models import RefundRequest
from refunds.sandbox.airline import owner_of

FORM_URL = "/refunds/new/"
_STATUS_URL = re.compile(r"/refunds/(?P<public_id>rf_[A-Za-z0-9_-]+)/$")
_FIRST = [c for c in string.ascii_uppercase if c not in "FBD"]  # F flex, B basic, DEC declines
_REST = string.ascii_uppercase + string.digits
_MESSAGES = (
    "Hi, something came up at work. Could you move me to flight {flight} on {day}? Thanks!",
    "Please rebook me onto {flight} on {day} instead, my meeting moved.",
    "I need to change my flight to a later one: {flight}, {day}. Happy to pay the fee.",
    "Can I switch to flight {flight} on {day}? Family emergency, sorry for the short notice.",
    "Hello, I'd like to reschedule to {flight} on {day}. Window seat if possible.",
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


def customers(rng: random.Random, count: int) -> list[Customer]:
    """Distinct standard-fare references, each sent by its owner (the passenger's last name
    and the booking's contact e-mail, as the sandbox derives them), so every refund should
    complete."""
    references: set[str] = set()
    while len(references) < count:
        tail = "".join(rng.choice(_REST) for _ in range(4))
        references.add(rng.choice(_FIRST) + rng.choice(string.digits) + tail)
    result = []
    for reference in sorted(references):
        day = date.today() + timedelta(days=rng.randint(14, 200))
        message = rng.choice(_MESSAGES).format(
            flight=f"SK{rng.randint(100, 9999)}", day=day.strftime("%-d %B %Y")
        )
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


class _HiddenInputs(HTMLParser):
    """Every hidden input of the page (CSRF token, submission token): posted back untouched."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[str, str] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "input" and found.get("type") == "hidden" and found.get("name"):
            self.values[str(found["name"])] = found.get("value") or ""


def submit(customer: Customer, *, double: str = "") -> Submission:
    """One customer's visit; `double` is "", "sequential" or "concurrent"."""
    client = Client(enforce_csrf_checks=True)
    page = client.get(FORM_URL)
    if page.status_code != 200:
        return _failed(customer, f"GET {FORM_URL} answered {page.status_code}")
    hidden = _HiddenInputs()
    hidden.feed(page.content.decode())
    data = {
        **hidden.values,
        "email": customer.email,
        "booking_reference": customer.booking_reference,
        "last_name": customer.last_name,
        "message": customer.message,
    }
    if double == "concurrent":
        locations = _post_concurrently(client, data)
    else:
        locations = [_post(client, data) for _ in range(2 if double else 1)]
    public_ids = {_public_id(location) for location in locations}
    if len(public_ids) != 1 or None in public_ids:
        return _failed(customer, f"POST answered {locations}", same=False if double else None)
    public_id = str(public_ids.pop())
    rows = RefundRequest.objects.filter(email=customer.email).values_list(
        "public_id", "workflow_id"
    )
    ids = dict(rows)
    return Submission(
        customer=customer,
        public_id=public_id,
        workflow_id=ids.get(public_id) or "",
        same_refund=(len(ids) == 1) if double else None,
    )


def _post(client: Client, data: dict[str, str]) -> str:
    response = client.post(FORM_URL, data)
    if response.status_code != 303:
        return f"HTTP {response.status_code}"
    return str(response["Location"])


def _post_concurrently(client: Client, data: dict[str, str]) -> list[str]:
    """A double click that races: two requests of one browser (same cookies) at the same time."""
    results: list[str] = ["", ""]
    barrier = threading.Barrier(2)

    def click(slot: int) -> None:
        twin = Client(enforce_csrf_checks=True)
        twin.cookies.update(client.cookies)  # the same browser: one session, one CSRF cookie
        try:
            barrier.wait(timeout=10)
            results[slot] = _post(twin, data)
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


def _public_id(location: str) -> str | None:
    match = _STATUS_URL.search(location)
    return match.group("public_id") if match else None


def _failed(customer: Customer, error: str, *, same: bool | None = None) -> Submission:
    return Submission(
        customer=customer, public_id="", workflow_id="", same_refund=same, error=error
    )
