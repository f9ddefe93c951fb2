"""The refund workflow under real crashes (SPEC §3.6, §5): real workers, the real sandbox.

Every worker runs with `AGENTFLOW_CRASH_AT=charge_customer:after_effect`: the article's crash,
right after the card was charged and before the checkpoint. Whatever else goes wrong, the
sandbox's ledger must show one effect per idempotency key and at most one payment per refund,
and every run must end COMPLETED or FAILED with the customer told.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction

from agentflow import durable
from agentflow.celery import app
from agentflow.models import RunEvent
from agentflow.workers import WorkerProcess
from refunds.models import RefundRequest
from refunds.sandbox.airline import owner_of
from tests.support.processes import worker_database_url
from tests.support.sandbox import SandboxProcess
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CRASH_AT = "charge_customer:after_effect"
EFFECT_LISTS = ("payments", "refunds", "seat_cancellations", "boarding_passes", "crm_updates")


@pytest.fixture
def worker(clean_sandbox: SandboxProcess, transactional_db: None) -> Iterator[WorkerProcess]:
    """One worker (two pool processes and an embedded beat) wired to the sandbox; SIGKILLed
    at teardown, before the test database is flushed."""
    broker = app.conf.broker_write_url or app.conf.broker_url
    env = {
        "DATABASE_URL": worker_database_url(),
        "CELERY_BROKER_URL": broker,
        "REDIS_URL": broker,
        "AGENTFLOW_VAR_DIR": str(settings.VAR_DIR),
        "AGENTFLOW_WORKFLOW_MODULES": "",
        "AGENTFLOW_FAULTS": "1",
        "AGENTFLOW_CRASH_AT": CRASH_AT,
        "AGENTFLOW_LEASE_SECONDS": "5",
        "AGENTFLOW_SWEEP_INTERVAL": "2",
        "SANDBOX_URL": clean_sandbox.url,
        "SANDBOX_SMTP_PORT": str(clean_sandbox.smtp_port),
        "STRIPE_API_BASE": clean_sandbox.url,
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": str(clean_sandbox.smtp_port),
        "REFUNDS_SUBMIT_LIMIT": "0",
        # Five quick attempts: a partner storm exhausts the budget in seconds, not minutes.
        "REFUNDS_PARTNER_MAX_ATTEMPTS": "5",
        "REFUNDS_PARTNER_RETRY_BASE_SECONDS": "0.25",
    }
    process = WorkerProcess(concurrency=2, env=env, beat=True)
    try:
        yield process.start(timeout=60)
    finally:
        process.kill()


def submit(reference: str) -> str:
    """What the form's service does: the request row and its run, in one transaction."""
    with transaction.atomic():
        owner = owner_of(reference)
        request = RefundRequest.objects.create(
            email=owner.email,
            last_name=owner.last_name,
            booking_reference=reference,
            message="Hi, please move me to SK1240 on 2027-03-16. Thanks!",
            submission_token=f"token-{reference}",
        )
        run_id = durable.start(
            "refund", input={"refund_id": request.public_id}, business_key=request.public_id
        )
        RefundRequest.objects.filter(pk=request.pk).update(workflow_id=run_id)
    return run_id


def finished(run_id: str, worker: WorkerProcess, timeout: float = 30) -> durable.RunSnapshot:
    def done() -> durable.RunSnapshot | None:
        assert worker.alive(), worker.log_tail()
        run = durable.snapshot(run_id)
        return run if run is not None and run.finished else None

    try:
        return wait_for(done, timeout=timeout, interval=0.05, what=f"run {run_id} to finish")
    except AssertionError:
        print(worker.log_tail(80))
        raise


def step(run: durable.RunSnapshot, name: str) -> durable.StepSnapshot:
    [found] = [s for s in run.steps if s.name == name]
    return found


def partner_effects(sandbox: SandboxProcess, run_id: str) -> dict[str, Any]:
    """This run's ledger, after checking I1: one effect per idempotency key, in every list."""
    ledger = sandbox.ledger(workflow_id=run_id)
    for kind in EFFECT_LISTS:
        keys = [entry["idempotency_key"] for entry in ledger[kind]]
        assert len(keys) == len(set(keys)), f"{kind}: {keys}"
        assert all(key.startswith(f"{run_id}_") for key in keys), keys  # _step_N or _bB_step_N
    return ledger


def test_crash_right_after_the_charge__one_payment_and_the_run_completes(
    worker: WorkerProcess, clean_sandbox: SandboxProcess
) -> None:
    run_id = submit("CRS001")

    run = finished(run_id, worker)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    assert "fault injection: SIGKILL at charge_customer:after_effect" in worker.log_tail(400)
    charge = step(run, "charge_customer")
    assert charge.attempts == 2  # the killed attempt, then the redelivered one
    ledger = partner_effects(clean_sandbox, run_id)
    [payment] = ledger["payments"]
    assert payment["idempotency_key"] == durable.idempotency_key(run_id, charge.seq)
    assert charge.output["payment_intent_id"] == payment["id"]
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.RECONCILED).exists()
    assert ledger["refunds"] == []
    assert [len(ledger[kind]) for kind in ("seat_cancellations", "boarding_passes")] == [1, 1]
    [email] = ledger["emails"]
    assert email["subject"].startswith("Your flight change is confirmed")
    assert email["deliveries"] == 1


def test_network_dies_after_the_charge__one_payment_and_the_run_completes(
    worker: WorkerProcess, clean_sandbox: SandboxProcess
) -> None:
    # Stripe charges, then every answer of the first attempt is lost (the library's 2 retries
    # included): the engine retries under the same key and Stripe replays the payment.
    clean_sandbox.set_fault(endpoint="payment_intents.create", drop_rate=1.0, count=3)
    run_id = submit("NET001")

    run = finished(run_id, worker)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    assert step(run, "charge_customer").attempts == 2
    ledger = partner_effects(clean_sandbox, run_id)
    assert len(ledger["payments"]) == 1
    assert ledger["replays"]["payment_intents.create"] >= 1
    assert len(ledger["emails"]) == 1


def test_declined_card__fails_readably_no_payment_customer_told(
    worker: WorkerProcess, clean_sandbox: SandboxProcess
) -> None:
    run_id = submit("DEC001")

    run = finished(run_id, worker)

    assert run.status == durable.RunStatus.FAILED
    assert run.error == "charge_customer: Your card was declined."
    ledger = partner_effects(clean_sandbox, run_id)
    assert ledger["payments"] == [] and ledger["refunds"] == []
    assert len(ledger["seat_cancellations"]) == 1  # made before the charge, and owned up to
    [email] = ledger["emails"]
    assert email["subject"] == "We couldn't change your booking DEC001"
    assert step(run, "notify_failure").output["reason"] == "Your card was declined."


def test_unknown_booking__fails_before_any_effect_like_any_mismatch(
    worker: WorkerProcess, clean_sandbox: SandboxProcess
) -> None:
    """An unknown reference says no more than a wrong name would, and nobody is written to:
    there is no contact on file to write to."""
    clean_sandbox.set_fault(unknown_bookings=["NOP001"])
    run_id = submit("NOP001")

    run = finished(run_id, worker)

    assert run.status == durable.RunStatus.FAILED
    assert run.error == "fetch_booking: These details don't match a booking."
    assert [s.name for s in run.steps] == [
        "load_request", "parse_flight_details", "fetch_booking", "notify_failure",
    ]  # fmt: skip
    ledger = partner_effects(clean_sandbox, run_id)
    assert all(ledger[kind] == [] for kind in EFFECT_LISTS)
    assert ledger["emails"] == []


def test_airline_storm_after_the_charge__fee_refunded_exactly_once(
    worker: WorkerProcess, clean_sandbox: SandboxProcess
) -> None:
    clean_sandbox.set_fault(endpoint="airline.boarding_pass", error_rate=1.0, error_status=500)
    run_id = submit("STM001")

    run = finished(run_id, worker, timeout=45)

    assert run.status == durable.RunStatus.FAILED
    assert run.error.startswith("issue_boarding_pass: gave up after 5 attempts")
    assert step(run, "issue_boarding_pass").attempts == 5
    ledger = partner_effects(clean_sandbox, run_id)
    [payment] = ledger["payments"]
    [refund] = ledger["refunds"]
    assert (refund["payment_intent"], refund["amount"]) == (payment["id"], 4500)
    assert refund["idempotency_key"] == durable.idempotency_key(run_id, step(run, "refund_fee").seq)
    assert ledger["boarding_passes"] == []
    [email] = ledger["emails"]
    assert email["subject"] == "We couldn't change your booking STM001"
    assert step(run, "notify_failure").output["reason"] == (
        "The airline couldn't issue your new boarding pass."
    )
