"""Stripe applies the charge and then goes dark (finding 1, docs/protocol.md, "Unknown outcomes"):
real worker, real sandbox, the real `stripe` library. The money must never be kept without the
service: the run parks "outcome unknown" (never FAILED), and once Stripe is back an operator's retry
finds the payment and finishes, or refunds it if the rebooking then fails for good; an operator's
cancel meanwhile refunds it once (issue 19).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentflow import durable
from agentflow.models import RunEvent
from agentflow.testing.processes import WorkerProcess
from agentflow.testing.waiting import wait_for
from tests.support.engine import stopped
from tests.support.refunds import (
    finished,
    holds_left,
    money_kept,
    partner_effects,
    refund_worker_env,
    step,
    submit,
)
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker(clean_sandbox: SandboxProcess, transactional_db: None) -> Iterator[WorkerProcess]:
    """One worker with beat, wired to the sandbox, no crash injection; quick partner retries."""
    env = refund_worker_env(
        clean_sandbox,
        AGENTFLOW_FAULTS="0",
        REFUNDS_PARTNER_MAX_ATTEMPTS="4",
        REFUNDS_PARTNER_RETRY_BASE_SECONDS="0.25",
    )
    process = WorkerProcess(concurrency=2, env=env, beat=True)
    try:
        yield process.start(timeout=60)
    finally:
        process.kill()


def stripe_goes_dark(sandbox: SandboxProcess, *, search_status: int | None = None) -> None:
    """Every charge is applied and its answer dropped (replays too); the payment search is cut
    off as well, or answers `search_status`."""
    sandbox.set_fault(endpoint="payment_intents.create", drop_rate=1.0)
    if search_status is None:
        sandbox.set_fault(endpoint="payment_intents.search", drop_rate=1.0)
    else:
        sandbox.set_fault(
            endpoint="payment_intents.search", error_rate=1.0, error_status=search_status
        )


def parked_unknown(run_id: str, worker: WorkerProcess, sandbox: SandboxProcess) -> None:
    run = stopped(run_id, timeout=90, worker=worker)
    assert run.status == durable.RunStatus.NEEDS_ATTENTION, run.error
    assert run.error.startswith("outcome unknown: charge_customer may or may not have taken")
    assert step(run, "charge_customer").status == durable.StepStatus.IN_PROGRESS
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.OUTCOME_UNKNOWN).exists()
    ledger = partner_effects(sandbox, run_id)
    assert len(ledger["authorizations"]) == 1  # Stripe held the fee once; replays added none
    assert ledger["payments"] == [] and ledger["refunds"] == []
    assert ledger["seat_cancellations"] == []  # the seat waits for the fee to be secured


def test_charge_applied_then_stripe_dark__parked_unknown__retry_adopts_the_payment(
    worker: WorkerProcess, clean_sandbox: SandboxProcess
) -> None:
    stripe_goes_dark(clean_sandbox)
    run_id = submit("OUT001")
    parked_unknown(run_id, worker, clean_sandbox)

    clean_sandbox.clear_faults()  # Stripe is back
    durable.retry(run_id, actor="ops", reason="Stripe is back")
    run = finished(run_id, worker, timeout=60)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    ledger = partner_effects(clean_sandbox, run_id)
    [payment] = ledger["payments"]
    assert step(run, "charge_customer").output["payment_intent_id"] == payment["id"]
    assert ledger["refunds"] == []
    assert len(ledger["boarding_passes"]) == 1
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.RECONCILED).exists()


def test_charge_applied_then_stripe_dark__airline_then_fails_for_good__hold_released_once(
    worker: WorkerProcess, clean_sandbox: SandboxProcess
) -> None:
    stripe_goes_dark(clean_sandbox)
    run_id = submit("OUT002")
    parked_unknown(run_id, worker, clean_sandbox)

    clean_sandbox.clear_faults()
    clean_sandbox.set_fault(endpoint="airline.boarding_pass", error_rate=1.0, error_status=400)
    durable.retry(run_id, actor="ops", reason="Stripe is back")
    run = finished(run_id, worker, timeout=60)

    assert run.status == durable.RunStatus.FAILED
    assert run.error.startswith("issue_boarding_pass: the airline refused the request")
    ledger = partner_effects(clean_sandbox, run_id)
    [hold] = ledger["authorizations"]
    [released] = ledger["authorization_cancels"]
    assert (released["id"], released["amount"]) == (hold["id"], 4500)
    assert ledger["payments"] == [] and ledger["refunds"] == []
    assert len(ledger["seat_reinstatements"]) == 1
    assert ledger["boarding_passes"] == []


def test_charge_applied_then_the_payment_lookup_fails__parked_unknown_not_failed(
    worker: WorkerProcess, clean_sandbox: SandboxProcess
) -> None:
    """A reconcile that raises (here Stripe answers the search with a 400, which the gateway
    calls permanent) used to fail the run holding the payment; it means "unknown"."""
    stripe_goes_dark(clean_sandbox, search_status=400)
    run_id = submit("OUT003")

    parked_unknown(run_id, worker, clean_sandbox)


@pytest.fixture
def limited_worker(
    clean_sandbox: SandboxProcess, transactional_db: None
) -> Iterator[WorkerProcess]:
    """As `worker`, with Stripe a limited partner (docs/partner-limits.md, "What happens"): its
    failures open a breaker."""
    env = refund_worker_env(
        clean_sandbox,
        AGENTFLOW_FAULTS="0",
        AGENTFLOW_PARTNER_LIMITS='{"stripe": {}}',
        REFUNDS_PARTNER_MAX_ATTEMPTS="4",
        REFUNDS_PARTNER_RETRY_BASE_SECONDS="0.25",
    )
    process = WorkerProcess(concurrency=2, env=env, beat=True)
    try:
        yield process.start(timeout=60)
    finally:
        process.kill()


def test_charge_applied_then_the_payment_lookup_fails__stripe_limited__parked_at_the_bound(
    limited_worker: WorkerProcess, clean_sandbox: SandboxProcess
) -> None:
    """The same with Stripe's breaker opening: each wait after a failed lookup or request
    used to give its attempt back, so the run waited for ever; a spent attempt counts, and the
    run parks "outcome unknown" at the bound."""
    stripe_goes_dark(clean_sandbox, search_status=400)
    run_id = submit("OUT005")

    parked_unknown(run_id, limited_worker, clean_sandbox)


# --- issue 19: an operator cancels while the charge's outcome is unknown ------------------------
@pytest.fixture
def patient_worker(
    clean_sandbox: SandboxProcess, transactional_db: None
) -> Iterator[WorkerProcess]:
    """A worker whose partner retries back off for seconds, long enough for an operator."""
    env = refund_worker_env(
        clean_sandbox,
        AGENTFLOW_FAULTS="0",
        REFUNDS_PARTNER_MAX_ATTEMPTS="8",
        REFUNDS_PARTNER_RETRY_BASE_SECONDS="3",
    )
    process = WorkerProcess(concurrency=2, env=env, beat=True)
    try:
        yield process.start(timeout=60)
    finally:
        process.kill()


def _charge_backing_off(run_id: str) -> bool:
    run = durable.snapshot(run_id)
    charges = [s for s in run.steps if s.name == "charge_customer"] if run else []
    return bool(charges) and charges[0].status == durable.StepStatus.FAILED


def test_operator_cancels_while_the_charge_backs_off_after_stripe_took_it__fee_refunded_once(
    patient_worker: WorkerProcess, clean_sandbox: SandboxProcess
) -> None:
    """Stripe takes the charge (a hold on the card, since the fee is taken only after the pass)
    and goes dark; while the step backs off an operator cancels; Stripe returns. Counted at the
    sandbox, not by us: one hold, released once, nothing taken, the seat never touched, the run
    CANCELLED. It used to end CANCELLED with the $45 kept (finding 1)."""
    stripe_goes_dark(clean_sandbox)
    run_id = submit("OUT004")
    wait_for(lambda: _charge_backing_off(run_id), timeout=60, what="the charge to back off")
    assert len(partner_effects(clean_sandbox, run_id)["authorizations"]) == 1  # Stripe holds it

    outcome = durable.cancel(run_id, actor="ops", reason="the customer withdrew")
    assert outcome is not None and outcome.startswith("cancel requested: whether charge_customer")
    asked_while_dark = RunEvent.objects.filter(
        run_id=run_id, kind=RunEvent.Kind.ATTEMPT_FAILED, detail__contains="cancelled; asking"
    )
    wait_for(asked_while_dark.exists, timeout=60, what="the cancel to ask Stripe while it is dark")
    clean_sandbox.clear_faults()  # Stripe returns
    run = finished(run_id, patient_worker, timeout=90)

    assert run.status == durable.RunStatus.CANCELLED, run.error
    ledger = partner_effects(clean_sandbox, run_id)
    [hold] = ledger["authorizations"]
    assert hold["amount"] == 4500
    assert [c["id"] for c in ledger["authorization_cancels"]] == [hold["id"]]
    assert money_kept(ledger) == 0 and holds_left(ledger) == []
    assert ledger["payments"] == [] and ledger["refunds"] == []
    assert ledger["seat_cancellations"] == [] and ledger["boarding_passes"] == []
    charge = step(run, "charge_customer")
    assert (charge.status, charge.output["payment_intent_id"]) == (
        durable.StepStatus.COMPLETED,
        hold["id"],
    )  # adopted from Stripe, never asked for again
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.RECONCILED).exists()
