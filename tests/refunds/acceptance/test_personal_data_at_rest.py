"""A customer's details encrypted at rest and erasable on request (issue 42, docs/privacy.md):
refunds with a medical fee waiver sent through the real form, run by a real worker against the
sandbox; then `pg_dump` of the whole database is searched for the customer's e-mail, name and
words, and the customer is erased with the money's history kept."""

from __future__ import annotations

import html
import re
import subprocess
from collections.abc import Iterator
from datetime import UTC, date, datetime
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client

from agentflow import durable
from agentflow._privacy import keystore
from agentflow.models import StepCheckpoint
from agentflow.testing.processes import WorkerProcess
from agentflow.testing.waiting import wait_for
from refunds import reconciliation, waivers
from refunds.models import RefundRequest
from refunds.sandbox.airline import booking, owner_of
from tests.support.airline_days import new_flight
from tests.support.refunds import finished, money_kept, partner_effects, refund_worker_env
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

#: Words no template, fixture or code holds: found in a dump, they came from this customer.
DETAILS = "Admitted to Kvarnholmen infirmary with a perforated zygomycosis ulcer."
WAIVER_WORDS = ("Kvarnholmen", "zygomycosis")
OPERATOR = "ops@skyways.example"


@pytest.fixture
def worker(clean_sandbox: SandboxProcess, transactional_db: None) -> Iterator[WorkerProcess]:
    started = WorkerProcess(concurrency=2, env=refund_worker_env(clean_sandbox), beat=True)
    try:
        yield started.start(timeout=60)
    finally:
        started.kill()


def through_the_form(reference: str) -> str:
    """The customer's request as the form sends it, with a medical waiver; its run's id."""
    client, owner = Client(), owner_of(reference)
    page = client.get("/refunds/new/").content.decode()
    token = re.search(r'name="submission_token" value="([^"]+)"', page)
    assert token, "the form carries no submission token"
    response = client.post(
        "/refunds/new/",
        {
            "email": owner.email,
            "booking_reference": reference,
            "last_name": owner.last_name,
            "message": new_flight().words(),
            "waiver_reason": "medical",
            "waiver_details": DETAILS,
            "submission_token": html.unescape(token.group(1)),
        },
        REMOTE_ADDR="203.0.113.9",
    )
    assert response.status_code == 303, response.content.decode()[:2000]
    refund = RefundRequest.objects.get(booking_reference=reference)
    assert refund.workflow_id
    return refund.workflow_id


def decided_to_the_end(run_id: str, worker: WorkerProcess, *, waived: bool) -> durable.RunSnapshot:
    def waiting() -> durable.RunSnapshot | None:
        assert worker.alive(), worker.log_tail()
        run = durable.snapshot(run_id)
        assert run is not None and not run.finished, run
        return run if run.waiting_for == "approval" else None

    run = wait_for(waiting, timeout=90, what=f"run {run_id} to wait for approval")
    assert run.pending_approval is not None
    assert run.pending_approval["arguments"]["details"] == DETAILS  # the operator reads them
    if waived:
        durable.approve(run_id, actor=OPERATOR, reason="Get well soon.")
    else:  # the fee is taken: money the erasure must leave listed and reconciled
        durable.reject(run_id, actor=OPERATOR, reason="The fare's rules apply.")
    return finished(run_id, worker, timeout=120)


def pg_dump() -> str:
    """The whole database as `pg_dump` writes it (every table, every row)."""
    db = connection.settings_dict
    command = ["pg_dump", "--no-owner", "-h", db["HOST"] or "127.0.0.1", "-U", db["USER"]]
    if db.get("PORT"):
        command += ["-p", str(db["PORT"])]
    env = {"PGPASSWORD": db.get("PASSWORD") or "", "PATH": "/usr/bin:/bin:/usr/local/bin"}
    done = subprocess.run(
        [*command, db["NAME"]], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def customer_words(reference: str) -> list[str]:
    """What of the customer a dump must not show: their e-mail, names and waiver words."""
    owner, found = owner_of(reference), booking(reference, today=date.min)
    first, last = found["passenger"]["first_name"], found["passenger"]["last_name"]
    return [owner.email, owner.email.split("@")[0], last, f"{first} {last}", *WAIVER_WORDS]


def status_json(run_id: str) -> dict[str, Any]:
    refund = RefundRequest.objects.get(workflow_id=run_id)
    return Client().get(f"/refunds/{refund.public_id}/status.json").json()


def test_waiver_refunds__pg_dump_holds_no_customer_details__erasure_keeps_the_money(
    worker: WorkerProcess, clean_sandbox: SandboxProcess, admin_client: Client
) -> None:
    references = ["PRV001", "PRV002"]
    runs = {ref: through_the_form(ref) for ref in references}
    for ref, run_id in runs.items():
        run = decided_to_the_end(run_id, worker, waived=ref != "PRV001")
        assert run.status == durable.RunStatus.COMPLETED, run.error

    dump = pg_dump()
    assert "agentflow_stepcheckpoint" in dump and "refunds_refundrequest" in dump
    for ref in references:
        for words in customer_words(ref):
            assert words not in dump, f"{words!r} of {ref} is in the dump in clear"
    assert runs["PRV001"] in dump and "PRV001" in dump  # ids and references stay readable

    # Those who may read see them: the request and the run, in clear, in the admin.
    gone, kept = runs["PRV001"], runs["PRV002"]
    refund = RefundRequest.objects.get(workflow_id=gone)
    page = admin_client.get(f"/admin/refunds/refundrequest/{refund.pk}/change/").content.decode()
    assert owner_of("PRV001").email in page and "Kvarnholmen" in page
    money_before = money_kept(partner_effects(clean_sandbox, gone))

    call_command(
        "agentflow_erase", subject=owner_of("PRV001").email, reason="GDPR #12", actor="dpo"
    )

    keystore.forget_cached()
    erased = RefundRequest.objects.get(workflow_id=gone)
    assert (erased.email, erased.last_name, erased.waiver_details) == ("erased",) * 3
    assert erased.booking_reference == "PRV001" and erased.waiver_reason == "medical"
    booked = StepCheckpoint.objects.get(run_id=gone, name="fetch_booking").output
    assert booked["contact_email"] == booked["passenger_name"] == "erased"
    assert booked["fare_class"]  # the rest of the record stays
    run = durable.snapshot(gone)
    assert run is not None and run.status == durable.RunStatus.COMPLETED
    assert [s.name for s in run.steps if s.name == waivers.STEP] == [waivers.STEP]
    assert money_kept(partner_effects(clean_sandbox, gone)) == money_before  # nothing undone
    page = admin_client.get(f"/admin/refunds/refundrequest/{refund.pk}/change/").content.decode()
    assert owner_of("PRV001").email not in page and "Kvarnholmen" not in page
    run_page = admin_client.get(f"/admin/agentflow/workflowrun/{quote(gone)}/change/")
    assert run_page.status_code == 200
    shown = run_page.content.decode()
    for words in customer_words("PRV001"):
        assert words not in shown
    status = str(status_json(gone))
    for words in customer_words("PRV001"):
        assert words not in status
    # The other customer's data is intact.
    other = RefundRequest.objects.get(workflow_id=kept)
    assert other.email == owner_of("PRV002").email and other.waiver_details == DETAILS
    # The nightly figures still add up: each fee Stripe took matches its run, the erased
    # customer's too (reconciliation reads none of the sealed fields).
    taken = clean_sandbox.ledger()["payments"]
    matched = []
    for day in sorted({datetime.fromtimestamp(p["created"], UTC).date() for p in taken}):
        night = finished(
            durable.start("reconcile_payments", input={"day": day.isoformat()}), worker, 120
        )
        assert night.status == durable.RunStatus.COMPLETED, night.error
        result = next(s.output for s in night.steps if s.name == "match_runs")
        assert all(not result[kind] for kind in reconciliation.MISMATCHES), result
        matched += [entry["id"] for entry in result["matched"]]
    assert sorted(matched) == sorted(p["id"] for p in taken)
    assert [p["workflow_id"] for p in taken] == [gone]  # the erased customer's fee


def test_erase__refused_while_the_customers_run_waits_for_approval(
    worker: WorkerProcess,
) -> None:
    run_id = through_the_form("PRV003")

    def waiting() -> str | None:
        run = durable.snapshot(run_id)
        return run.waiting_for if run is not None else None

    wait_for(waiting, timeout=90, what="the run to wait for approval")

    with pytest.raises(CommandError, match=f"still in flight \\({run_id}\\)"):
        call_command("agentflow_erase", subject=owner_of("PRV003").email, reason="x", actor="a")
    assert RefundRequest.objects.get(workflow_id=run_id).waiver_details == DETAILS
