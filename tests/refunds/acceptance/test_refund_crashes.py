"""The refund workflow under real crashes (docs/protocol.md, "Crash points"; docs/refunds.md): real
workers, the real sandbox.

Every worker runs with `AGENTFLOW_CRASH_AT=charge_customer:after_effect`: the crash
right after the fee was secured on the card and before the checkpoint. Whatever else goes wrong, the
sandbox's ledger must show one effect per idempotency key and at most one payment per refund,
and every run must end COMPLETED or FAILED with the customer told.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentflow import durable
from agentflow.models import RunEvent
from agentflow.testing.processes import WorkerProcess
from tests.support.refunds import (
    EFFECT_LISTS,
    finished,
    partner_effects,
    refund_worker_env,
    step,
    submit,
)
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

CRASH_AT = "charge_customer:after_effect"


@pytest.fixture
def worker(clean_sandbox: SandboxProcess, transactional_db: None) -> Iterator[WorkerProcess]:
    """One worker (two pool processes and an embedded beat) wired to the sandbox; SIGKILLed
    at teardown, before the test database is flushed."""
    env = refund_worker_env(
        clean_sandbox,
        AGENTFLOW_FAULTS="1",
        AGENTFLOW_CRASH_AT=CRASH_AT,
        AGENTFLOW_SWEEP_INTERVAL="2",
        # Five quick attempts: a partner storm exhausts the budget in seconds, not minutes.
        REFUNDS_PARTNER_MAX_ATTEMPTS="5",
        REFUNDS_PARTNER_RETRY_BASE_SECONDS="0.25",
    )
    process = WorkerProcess(concurrency=2, env=env, beat=True)
    try:
        yield process.start(timeout=60)
    finally:
        process.kill()


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
    [hold] = ledger["authorizations"]
    assert hold["idempotency_key"] == durable.idempotency_key(run_id, charge.seq)
    assert charge.output["payment_intent_id"] == hold["id"]
    [payment] = ledger["payments"]  # the hold, taken once after the boarding pass
    assert (payment["id"], payment["amount"]) == (hold["id"], 4500)
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
    assert ledger["seat_cancellations"] == []  # the fee is secured before the seat is touched
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
        "load_request",
        "parse_flight_details",
        "fetch_booking",
        "notify_failure",
    ]
    ledger = partner_effects(clean_sandbox, run_id)
    assert all(ledger[kind] == [] for kind in EFFECT_LISTS)
    assert ledger["emails"] == []


def test_airline_storm_after_the_hold__hold_released_seat_given_back(
    worker: WorkerProcess, clean_sandbox: SandboxProcess
) -> None:
    clean_sandbox.set_fault(endpoint="airline.boarding_pass", error_rate=1.0, error_status=500)
    run_id = submit("STM001")

    run = finished(run_id, worker, timeout=45)

    assert run.status == durable.RunStatus.FAILED
    assert run.error.startswith("issue_boarding_pass: gave up after 5 attempts")
    assert step(run, "issue_boarding_pass").attempts == 5
    ledger = partner_effects(clean_sandbox, run_id)
    [hold] = ledger["authorizations"]
    [released] = ledger["authorization_cancels"]  # never taken: nothing to refund
    assert (released["id"], released["amount"]) == (hold["id"], 4500)
    undo = step(run, "refund_fee").seq
    assert released["idempotency_key"] == durable.idempotency_key(run_id, undo)
    assert ledger["payments"] == [] and ledger["refunds"] == []
    assert len(ledger["seat_reinstatements"]) == 1
    assert ledger["boarding_passes"] == []
    [email] = ledger["emails"]
    assert email["subject"] == "We couldn't change your booking STM001"
    assert step(run, "notify_failure").output["reason"] == (
        "The airline couldn't issue your new boarding pass."
    )
