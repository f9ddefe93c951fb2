"""A person in a real Chromium asks for a rebooking and watches it finish, end to end.

Real pieces: the web app (pytest-django's live server), Celery worker processes, a Redis
broker, Postgres, and the partner sandbox (Stripe, airline, CRM, SMTP). Screenshots of the form
and of the finished status page, at desktop and phone width, go to $PAGES_SHOTS_DIR (default
/tmp/pages-shots/) for a person to look at.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction

from agentflow.testing.waiting import wait_for
from refunds.models import RefundRequest
from refunds.ownership import MISMATCH
from refunds.sandbox.airline import owner_of
from tests.support.browser import DESKTOP, db
from tests.support.processes import Workers
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = Path(os.environ.get("PAGES_SHOTS_DIR", "/tmp/pages-shots"))
PHONE = {"width": 390, "height": 844}
DONE = "All done — your new boarding pass is on its way"
STATUS_URL = re.compile(r"/refunds/rf_[A-Za-z0-9_-]+/$")
#: Generous: two cold worker processes on two shared cores, ten steps, four partners.
RUN_SECONDS = 90


def fill_form(
    page: Any,
    *,
    reference: str = "abc123",
    last_name: str | None = None,
    email: str | None = None,
    message: str = "Hi! Could you move me to the evening flight on the same day, please? Thanks",
) -> None:
    """The booking's owner filling in the form, unless `last_name` or `email` say otherwise."""
    owner = owner_of(reference)
    page.get_by_label("Booking reference").fill(reference)
    page.get_by_label("Passenger's last name").fill(
        owner.last_name if last_name is None else last_name
    )
    page.get_by_label("Email address").fill(owner.email if email is None else email)
    page.get_by_label("What would you like to change?").fill(message)


def shoot(page: Any, name: str) -> None:
    """Desktop and phone-width screenshots of the page as it is now."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size(DESKTOP)
    page.screenshot(path=str(SHOTS / f"{name}-desktop.png"), full_page=True)
    page.set_viewport_size(PHONE)
    page.screenshot(path=str(SHOTS / f"{name}-phone.png"), full_page=True)
    page.set_viewport_size(DESKTOP)


def refunds() -> int:
    return db(RefundRequest.objects.count)


def refund_of(url: str) -> RefundRequest:
    public_id = url.rstrip("/").split("/")[-1]
    return db(lambda: RefundRequest.objects.get(public_id=public_id))


def test_customer__submits_the_form_and_watches_it_finish_without_reloading(
    running: SandboxProcess, workers: Workers, page: Any
) -> None:
    owner = owner_of("XYZ789")  # Åberg, typed as a keyboard without Å would
    page.goto("/refunds/new/")
    shoot(page, "form")
    fill_form(page, reference="xyz789", last_name="  ABERG ", email=owner.email.upper())
    page.get_by_role("button", name="Send my request").click()
    page.wait_for_url("**/refunds/rf_*/")
    status_url = page.url
    assert page.get_by_role("heading", name="Your rebooking request").is_visible()

    # Mark this document: a reload or a navigation would lose the mark.
    page.evaluate("window.__stillSamePage = true")
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    page.get_by_text(DONE).wait_for(timeout=RUN_SECONDS * 1000)
    assert page.evaluate("window.__stillSamePage") is True
    assert navigations == []
    assert page.url == status_url

    assert page.locator('[aria-live="polite"]').inner_text().startswith(DONE)
    assert page.locator(".step--done").count() == 12  # the graph refund (v4) but its unasked waiver
    assert page.get_by_text("Securing the $45 change fee on your card").is_visible()
    shoot(page, "completed")

    refund = refund_of(status_url)
    ledger = running.ledger(workflow_id=refund.workflow_id)
    assert len(ledger["payments"]) == 1
    [issued] = ledger["boarding_passes"]
    [email] = ledger["emails"]
    assert email["to"] == [owner.email]  # the contact on file, not the address as typed
    # What changed, on the page and in the e-mail, in the customer's words.
    details = page.locator("#status-details").inner_text()
    for words in (
        f"New flight: {issued['flight']} on ",
        f"New seat: {issued['seat']}",
        "Change fee: $45, charged to your card",
    ):
        assert words in details
    for words in (f"New seat:       {issued['seat']}", "Change fee:     $45.00, charged"):
        assert words in email["body"]
    # Logs name neither the customer's address nor the status page.
    logs = "".join(worker.log_path.read_text(errors="replace") for worker in workers.started)
    assert owner.email not in logs.lower() and refund.public_id not in logs


def wait_until_final(page: Any) -> str:
    """The status page's headline once the run is over (the page stops polling)."""
    page.locator('#progress[data-final="true"]').wait_for(timeout=RUN_SECONDS * 1000)
    return page.locator("#status-headline").inner_text()


def test_someone_elses_details__fail_with_one_message_and_change_nothing(
    running: SandboxProcess, page: Any
) -> None:
    """Knowing a booking reference is not owning the booking."""
    owner, other = owner_of("ABC123"), owner_of("XYZ789")
    attempts = {
        "wrong surname": {"last_name": "Eriksson"},
        "wrong email": {"email": "camille.eriksen@example.com"},
        "someone else's booking": {"last_name": other.last_name, "email": other.email},
    }
    assert owner.last_name == "Eriksen" and other.last_name != owner.last_name
    for what, typed in attempts.items():
        page.goto("/refunds/new/")
        fill_form(page, message=f"Move me to the evening flight ({what}).", **typed)
        page.get_by_role("button", name="Send my request").click()
        page.wait_for_url("**/refunds/rf_*/")
        assert wait_until_final(page) == "We couldn't complete the change", what
        summary = page.locator('[aria-live="polite"]').inner_text()
        assert MISMATCH in summary, what
        assert "No email was sent about this request." in summary, what
        for detail in ("surname", "last name is", "email is", owner.email, "Eriksen"):
            assert detail not in summary, (what, detail)
        run = refund_of(page.url).workflow_id
        ledger = running.ledger(workflow_id=run)
        for kind in ("seat_cancellations", "payments", "boarding_passes", "crm_updates", "emails"):
            assert ledger[kind] == [], (what, kind)
    shoot(page, "not-the-owner")
    assert running.ledger()["emails"] == []  # nothing to anyone, the typed addresses included


def test_stolen_card__the_customer_is_told_only_that_it_was_declined(
    running: SandboxProcess, page: Any
) -> None:
    page.goto("/refunds/new/")
    fill_form(page, reference="stl123")
    page.get_by_role("button", name="Send my request").click()
    page.wait_for_url("**/refunds/rf_*/")
    assert wait_until_final(page) == "We couldn't complete the change"
    summary = page.locator('[aria-live="polite"]').inner_text()
    assert "Your card was declined." in summary
    [email] = running.ledger(workflow_id=refund_of(page.url).workflow_id)["emails"]
    assert email["to"] == [owner_of("STL123").email]
    assert "Why: Your card was declined." in email["body"]
    for text in (summary, email["body"]):
        assert "stolen" not in text.lower() and "lost" not in text.lower()


def test_customer__double_click_on_send_makes_one_refund(page: Any) -> None:
    """Two clicks while the first is still on its way: both reach the server with the same
    form, and race to create the refund.

    The requests table is locked against inserts while the person clicks, as a slow database
    would; both requests wait on it, then race to insert one token once it is released.
    """
    page.goto("/refunds/new/")
    fill_form(page)
    posts: list[str] = []
    page.on("request", lambda request: request.method == "POST" and posts.append(request.url))
    button = page.get_by_role("button", name="Send my request")
    button.scroll_into_view_if_needed()  # the mouse clicks where the viewport shows it
    box = button.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    with inserts_held(RefundRequest._meta.db_table) as release:
        page.mouse.click(x, y)
        wait_for(lambda: waiting_on_locks() >= 1, timeout=30, what="the first click's insert")
        page.mouse.click(x, y)  # the mouse does not wait for the first page to load
        wait_for(lambda: waiting_on_locks() >= 2, timeout=30, what="the second click's insert")
        release()
    from playwright.sync_api import expect

    # Polled, not tied to one navigation: the first click's navigation ends aborted.
    expect(page).to_have_url(STATUS_URL, timeout=30_000)
    assert len(posts) == 2
    assert refunds() == 1
    assert refund_of(page.url).booking_reference == "ABC123"


@contextmanager
def inserts_held(table: str) -> Iterator[Callable[[], None]]:
    """Lock `table` against writes from another connection until `release()` is called.

    Readers still pass, so a request gets as far as its insert and waits there. Kept well
    under the connections' lock_timeout (5 s), after which a waiting insert would give up.
    """
    locked, released = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(f'LOCK TABLE "{table}" IN SHARE ROW EXCLUSIVE MODE')
                locked.set()
                released.wait(timeout=10)
        finally:
            connection.close()

    holder = threading.Thread(target=hold, name="insert-lock-holder")
    holder.start()
    assert locked.wait(timeout=10)
    try:
        yield released.set
    finally:
        released.set()
        holder.join(timeout=15)


def waiting_on_locks() -> int:
    def count() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            return int(cursor.fetchone()[0])

    return db(count)


def test_customer__back_button_and_send_again_lands_on_the_same_refund(page: Any) -> None:
    page.goto("/refunds/new/")
    fill_form(page)
    page.get_by_role("button", name="Send my request").click()
    page.wait_for_url("**/refunds/rf_*/")
    first_url = page.url

    page.go_back(wait_until="commit")  # a page restored from the cache fires no new "load"
    page.wait_for_url("**/refunds/new/", wait_until="commit")
    assert page.get_by_label("Booking reference").input_value() == "abc123"  # as they left it
    page.get_by_role("button", name="Send my request").click()
    page.wait_for_url("**/refunds/rf_*/")
    assert page.url == first_url
    assert refunds() == 1
