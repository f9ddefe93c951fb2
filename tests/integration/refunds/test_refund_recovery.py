"""The refund workflow's own recoveries, played in this process against the partner sandbox:
what a takeover finds at the partner when its first attempt is older than the partner's key
window (SPEC 3.3b, finding 9)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from agentflow import durable, runtime, store
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow.states import RunStatus, StepStatus
from refunds.gateways import PaymentGateway
from refunds.workflows import refund
from tests.support.refunds import submit
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def step_until(run_id: str, name: str) -> WorkflowRun:
    """Play the worker until the run is at step `name` (not yet run)."""
    for _ in range(30):
        run = WorkflowRun.objects.get(pk=run_id)
        if run.current_step == name:
            return run
        runtime.run_step(run_id, run.current_seq)
    raise AssertionError(f"{run_id} never reached {name}")


def test_fee_refund__first_attempt_days_ago__found_at_stripe_and_adopted_not_parked(
    partners: SandboxProcess, settings: Any
) -> None:
    """The fee refund was made, its worker died before recording it, and the run was found
    three days later, past Stripe's 24-hour key window: retrying blindly could refund twice,
    parking would wait for ever. Its reconcile finds the refund by its key and adopts it."""
    partners.set_fault(endpoint="airline.boarding_pass", error_rate=1.0, error_status=400)
    run_id = submit("RKW001")
    run = step_until(run_id, "refund_fee@7")  # the compensation of the charge at 7
    state = store.state_load(run_id, run.current_seq)
    assert state is not None
    undo = refund.step_named(run.current_step)
    assert undo is not None
    claim = store.step_claim(state, undo, run.current_seq, None)
    assert claim is not None  # the refund is made at Stripe under this step's key...
    charge = StepCheckpoint.objects.get(run_id=run_id, name="charge_customer").output
    PaymentGateway.from_settings().refund(
        payment_intent_id=charge["payment_intent_id"],
        amount_cents=charge["amount_cents"],
        key=durable.idempotency_key(run_id, run.current_seq),
        workflow_id=run_id,
    )
    days_ago = timezone.now() - timedelta(days=3)  # ...then its worker died, long ago
    StepCheckpoint.objects.filter(run_id=run_id, seq=run.current_seq).update(
        first_started_at=days_ago, started_at=days_ago, lease_expires_at=days_ago, lease_lock=None
    )

    for _ in range(5):
        current = WorkflowRun.objects.get(pk=run_id)
        if current.status not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING):
            break
        runtime.run_step(run_id, current.current_seq)

    finished = WorkflowRun.objects.get(pk=run_id)
    assert finished.status == RunStatus.FAILED, finished.error  # not NEEDS_ATTENTION
    undone = StepCheckpoint.objects.get(run_id=run_id, name="refund_fee")
    assert (undone.status, undone.attempts) == (StepStatus.COMPLETED, 2)
    ledger = partners.ledger(workflow_id=run_id)
    assert len(ledger["payments"]) == 1 and len(ledger["refunds"]) == 1  # refunded once
    assert undone.output["refund_id"] == ledger["refunds"][0]["id"]
