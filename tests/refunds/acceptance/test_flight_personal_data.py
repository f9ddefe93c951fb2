"""A cancelled flight's refunds are their passengers' (issues 40 and 42, docs/privacy.md): a
small flight cancelled through the sandbox, its refunds run by a real worker; then `pg_dump`
of the whole database holds none of the passengers' e-mails or last names in clear (the
requests, the child runs bulk-started from the flight, and the manifest the flight's run
keeps), and erasing one passenger leaves the others readable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow._privacy import keystore
from agentflow._privacy.models import RunSubject
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow.testing.processes import WorkerProcess
from agentflow.testing.waiting import wait_for
from refunds.models import RefundRequest
from refunds.privacy import email_digest
from refunds.sandbox.airline import owner_of
from refunds.sandbox.flights import manifest_references
from tests.refunds.acceptance.test_personal_data_at_rest import pg_dump
from tests.support.airline_days import new_flight
from tests.support.refunds import refund_worker_env
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

PASSENGERS = 3
SECRET = "whsec_airline_test"


@pytest.fixture
def service(live_server: Any, settings: Any, clean_sandbox: SandboxProcess) -> SandboxProcess:
    settings.REFUNDS_AIRLINE_SECRET = SECRET
    settings.REFUNDS_AIRLINE_NOTICES_URL = f"{live_server.url}/refunds/airline/notices/"
    settings.SANDBOX_URL = clean_sandbox.url
    settings.STRIPE_API_BASE = clean_sandbox.url
    return clean_sandbox


@pytest.fixture
def worker(service: SandboxProcess) -> Iterator[WorkerProcess]:
    process = WorkerProcess(concurrency=2, env=refund_worker_env(service), beat=True)
    try:
        yield process.start(timeout=60)
    finally:
        process.kill()


def ended(run_id: str, worker: WorkerProcess) -> WorkflowRun:
    def done() -> WorkflowRun | None:
        assert worker.alive(), worker.log_tail()
        run = WorkflowRun.objects.get(pk=run_id)
        return run if run.status not in ACTIVE_RUN_STATUSES else None

    return wait_for(done, timeout=240, interval=0.5, what=f"run {run_id} to end")


def in_clear(words: str, dump: str) -> bool:
    """Whether `words` is in the dump as a value (a JSON string or a whole column), not as a
    run of letters some ciphertext happens to hold."""
    return any(f"{left}{words}{right}" in dump for left in '"\t' for right in '"\t\n')


def test_flight_refunds__sealed_per_passenger__erasing_one_leaves_the_others(
    service: SandboxProcess, worker: WorkerProcess
) -> None:
    flight = new_flight("SK1236", weeks_ahead=6)
    call_command(
        "sandbox",
        "cancel-flight",
        flight.flight,
        "--date",
        flight.date,
        "--passengers",
        str(PASSENGERS),
    )
    parent = WorkflowRun.objects.get(workflow="flight_cancelled")
    assert ended(parent.id, worker).status == RunStatus.COMPLETED
    references = manifest_references(flight.flight, flight.day, PASSENGERS)
    owners = {ref: owner_of(ref) for ref in references}
    kids = {r.booking_reference: r.workflow_id for r in RefundRequest.objects.all()}
    assert sorted(kids) == sorted(references)
    for ref, run_id in kids.items():
        assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED
        # Bound to the passenger's key, and the request found by its digest.
        assert RunSubject.objects.filter(run_id=run_id).exists()
        assert RefundRequest.objects.get(email_digest=email_digest(owners[ref].email)).workflow_id
        assert WorkflowRun.objects.get(pk=run_id).input["customer"] == owners[ref].email.lower()

    dump = pg_dump()
    assert "refunds_refundrequest" in dump and references[0] in dump
    for ref, owner in owners.items():
        assert owner.email not in dump, f"{ref}'s e-mail is in the dump in clear"
        assert owner.email.split("@")[0] not in dump
        assert not in_clear(owner.last_name, dump), f"{ref}'s last name is in the dump in clear"

    gone, kept = references[0], references[1]
    call_command("agentflow_erase", subject=owners[gone].email, reason="GDPR #40", actor="dpo")
    keystore.forget_cached()

    erased = RefundRequest.objects.get(booking_reference=gone)
    assert (erased.email, erased.last_name) == ("erased", "erased")
    other = RefundRequest.objects.get(booking_reference=kept)
    assert (other.email, other.last_name) == (owners[kept].email, owners[kept].last_name)
    booked = StepCheckpoint.objects.get(run_id=kids[gone], name="fetch_booking").output
    assert booked["contact_email"] == "erased"
    booked = StepCheckpoint.objects.get(run_id=kids[kept], name="fetch_booking").output
    assert booked["contact_email"] == owners[kept].email
    manifest = StepCheckpoint.objects.get(run_id=parent.id, name="read_manifest").output
    seen = {p["reference"]: p for p in manifest["passengers"]}
    assert (seen[gone]["email"], seen[gone]["last_name"]) == ("erased", "erased")
    assert seen[kept]["email"] == owners[kept].email
    assert seen[kept]["last_name"] == owners[kept].last_name
    run = durable.snapshot(kids[gone])
    assert run is not None and run.status == RunStatus.COMPLETED  # the run's record stays
