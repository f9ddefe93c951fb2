"""A fee waiver end to end in a real Chromium (issue 18): the customer asks for it on the form
and watches their status page say it waits for our team; an operator approves or rejects it
with the admin's buttons; the customer's page, still open, moves on by itself to the outcome.

Real pieces: the web app (pytest-django's live server), a Celery worker with its beat, Redis,
Postgres and the partner sandbox, counted at its ledger. Both engines.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User

from agentflow.testing.waiting import wait_for
from refunds import policy
from refunds.models import RefundRequest
from refunds.sandbox.airline import owner_of
from tests.support.admin import LIST_URL
from tests.support.airline_days import new_flight
from tests.support.browser import db
from tests.support.processes import Workers
from tests.support.refunds import money_kept
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ENGINES = ["graph", "agent"]
PASSWORD = "correct horse battery staple"
OPERATOR = "ops-waivers"
DONE = "All done — your new boarding pass is on its way"
WAITING = "Your fee waiver request is waiting for our team"
#: Screenshots of the waiting status page, for a person to look at (as test_browser's).
SHOTS = Path(os.environ.get("PAGES_SHOTS_DIR", "/tmp/pages-shots"))
#: Generous: a cold worker on two shared cores.
RUN_SECONDS = 90


@pytest.fixture(params=ENGINES)
def engine(
    request: pytest.FixtureRequest, workers: Workers, clean_sandbox: SandboxProcess, settings: Any
) -> Iterator[str]:
    """A real worker (two pool processes, its beat) running refunds in this engine against the
    sandbox; the live server starts the same engine's runs."""
    settings.REFUNDS_ENGINE = request.param
    workers.start(
        concurrency=2,
        beat=True,
        REFUNDS_ENGINE=request.param,
        SANDBOX_URL=clean_sandbox.url,
        SANDBOX_SMTP_PORT=str(clean_sandbox.smtp_port),
        STRIPE_API_BASE=clean_sandbox.url,
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=str(clean_sandbox.smtp_port),
    )
    yield request.param
    workers.kill_all()  # before the test database is flushed


def approver() -> None:
    """A staff member who may view runs and decide approvals, and nothing more."""

    def create() -> None:
        user = User.objects.create_user(OPERATOR, password=PASSWORD, is_staff=True)
        for codename in ("view_workflowrun", "approve_workflowrun"):
            user.user_permissions.add(Permission.objects.get(codename=codename))

    db(create)


def ask_for_a_waiver(page: Any, reference: str) -> RefundRequest:
    """The booking's owner asks for a change with a bereavement waiver, and their status page
    says it waits for our team with nothing done."""
    owner = owner_of(reference)
    page.goto("/refunds/new/")
    page.get_by_label("Booking reference").fill(reference)
    page.get_by_label("Passenger's last name").fill(owner.last_name)
    page.get_by_label("Email address").fill(owner.email)
    # A day counted from the airline's today, written as a customer would ("16 March 2027").
    new = new_flight()
    page.get_by_label("What would you like to change?").fill(
        f"Please move me to {new.flight} on {new.day:%-d %B %Y}."
    )
    page.get_by_label("Ask us to waive the change fee?").select_option("bereavement")
    page.get_by_label("What happened?").fill("My grandmother died; the funeral is that day.")
    page.get_by_role("button", name="Send my request").click()
    page.wait_for_url("**/refunds/rf_*/")
    page.get_by_text(WAITING).wait_for(timeout=RUN_SECONDS * 1000)
    step = page.locator(".step--awaiting")
    assert step.locator(".step__state").inner_text() == "Waiting for our team"
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "waiver-waiting-desktop.png"), full_page=True)
    public_id = page.url.rstrip("/").split("/")[-1]
    return db(lambda: RefundRequest.objects.get(public_id=public_id))


def nothing_done(sandbox: SandboxProcess, run_id: str) -> None:
    ledger = sandbox.ledger(workflow_id=run_id)
    for kind in ("authorizations", "payments", "seat_cancellations", "boarding_passes", "emails"):
        assert ledger[kind] == [], kind


def decide(page: Any, run_id: str, verb: str, reason: str, *, told: str = "") -> None:
    """In a tab of their own, the operator logs in, opens the run, presses `verb`, reads the
    waiting call, gives their internal reason and picks what the customer is told (`told`, or
    the policy's first sentence), reads the preview of those words and confirms."""
    admin = page.context.new_page()
    try:
        admin.goto("/admin/login/?next=/admin/")
        admin.fill("#id_username", OPERATOR)
        admin.fill("#id_password", PASSWORD)
        admin.get_by_role("button", name="Log in").click()
        admin.wait_for_url("**/admin/")
        admin.goto(f"{LIST_URL}{quote(run_id)}/change/")
        admin.locator(f"a.af-tool-{verb}").click()
        call = admin.locator(".af-pending-call")
        assert "request_fee_waiver" in call.inner_text()
        assert "bereavement" in call.inner_text()
        admin.get_by_label("Reason:").fill(reason)
        if told:
            admin.get_by_label(told).check()
        admin.screenshot(path=str(SHOTS / f"waiver-{verb}-form.png"), full_page=True)
        admin.get_by_role("button", name="Preview what the customer reads").click()
        admin.screenshot(path=str(SHOTS / f"waiver-{verb}-preview.png"), full_page=True)
        preview = admin.locator("#af-preview-reply").inner_text()
        assert preview == (told or policy.WAIVER_REPLIES[verb][0]) and reason not in preview
        admin.locator('.submit-row input.default[type="submit"]').click()
        admin.wait_for_url("**/change/")
    finally:
        admin.close()


def test_operator_approves_in_the_admin__the_customer_sees_it_done_with_no_fee(
    engine: str, clean_sandbox: SandboxProcess, page: Any
) -> None:
    approver()
    refund = ask_for_a_waiver(page, f"WBA{engine[0].upper()}01")
    nothing_done(clean_sandbox, refund.workflow_id)

    decide(page, refund.workflow_id, "approve", "Our condolences; fee waived.")

    page.get_by_text(DONE).wait_for(timeout=RUN_SECONDS * 1000)  # the same page, by itself
    details = page.locator("#status-details").inner_text()
    assert "Change fee: none, our team waived it" in details
    assert "Fee waiver: approved by our team" in details
    ledger = clean_sandbox.ledger(workflow_id=refund.workflow_id)
    assert ledger["authorizations"] == [] and ledger["payments"] == [] and money_kept(ledger) == 0
    assert len(ledger["boarding_passes"]) == 1


def test_operator_rejects_in_the_admin__the_customer_sees_the_fee_and_the_chosen_sentence(
    engine: str, clean_sandbox: SandboxProcess, page: Any
) -> None:
    approver()
    refund = ask_for_a_waiver(page, f"WBR{engine[0].upper()}01")
    nothing_done(clean_sandbox, refund.workflow_id)

    told = policy.WAIVER_REPLIES["reject"][2]
    decide(page, refund.workflow_id, "reject", "We need the death certificate", told=told)

    page.get_by_text(DONE).wait_for(timeout=RUN_SECONDS * 1000)
    details = page.locator("#status-details").inner_text()
    assert "Change fee: $45, charged to your card" in details
    assert told in details and "death certificate" not in details and OPERATOR not in details
    ledger = clean_sandbox.ledger(workflow_id=refund.workflow_id)
    assert [p["amount"] for p in ledger["payments"]] == [4500] and money_kept(ledger) == 4500
    assert len(ledger["boarding_passes"]) == 1
    wait_for(lambda: len(clean_sandbox.ledger(workflow_id=refund.workflow_id)["emails"]) == 1)
