"""The refund workflow's own recoveries, played in this process against the partner sandbox:
what a takeover finds at the partner when its first attempt is older than the partner's key
window (docs/protocol.md, "The key window", finding 9)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus, StepStatus
from agentflow._engine import runtime
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow.testing.waiting import wait_for
from refunds.gateways import PaymentGateway
from refunds.workflows import refund
from tests.support.refunds import submit
from tests.support.sandbox import SandboxProcess, start_sandbox

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def step_until(run_id: str, name: str) -> WorkflowRun:
    """Play the worker until the run is at step `name` (not yet run)."""
    for _ in range(30):
        run = WorkflowRun.objects.get(pk=run_id)
        if run.current_step == name:
            return run
        runtime.run_step(run_id, run.current_seq)
    raise AssertionError(f"{run_id} never reached {name}")


def play_out(run_id: str) -> WorkflowRun:
    for _ in range(8):
        current = WorkflowRun.objects.get(pk=run_id)
        if current.status not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING):
            break
        runtime.run_step(run_id, current.current_seq)
    return WorkflowRun.objects.get(pk=run_id)


def claimed_then_died_days_ago(run_id: str, name: str) -> int:
    """Claim the run's current step `name`, then age it: its worker died three days ago."""
    run = step_until(run_id, name)
    state = store.state_load(run_id, run.current_seq)
    assert state is not None
    assert store.step_claim(state, refund.steps[name], run.current_seq, None) is not None
    days_ago = timezone.now() - timedelta(days=3)
    StepCheckpoint.objects.filter(run_id=run_id, seq=run.current_seq).update(
        first_started_at=days_ago, started_at=days_ago, lease_expires_at=days_ago, lease_lock=None
    )
    return run.current_seq


def test_fee_capture__made_then_lost_days_ago__found_at_stripe_not_taken_twice(
    partners: SandboxProcess,
) -> None:
    """Past Stripe's key window the capture is never sent blindly: the takeover reads the
    payment (consistent) and adopts the capture the dead worker made."""
    run_id = submit("RKW002")
    seq = claimed_then_died_days_ago(run_id, "capture_fee")
    hold = StepCheckpoint.objects.get(run_id=run_id, name="charge_customer").output
    PaymentGateway.from_settings().capture(
        payment_intent_id=hold["payment_intent_id"], key=durable.idempotency_key(run_id, seq)
    )

    finished = play_out(run_id)

    assert finished.status == RunStatus.COMPLETED, finished.error
    ledger = partners.ledger(workflow_id=run_id)
    assert [p["amount"] for p in ledger["payments"]] == [4500]
    assert ledger["requests"]["payment_intents.capture"] == 1  # the dead worker's, only


def test_fee_capture__hold_lapsed_before_a_late_takeover__nothing_kept_seat_given_back(
    tmp_path: Path, settings: Any
) -> None:
    """A run found after its hold lapsed (Stripe: 7 days; 2 s here) cannot take the fee: it
    fails, the customer's seat is given back, nothing is kept, and the e-mail says so."""
    server = start_sandbox(tmp_path / "short-holds", authorization_seconds=2)
    try:
        settings.SANDBOX_URL = settings.STRIPE_API_BASE = server.url
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.smtp_port
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        run_id = submit("RKW003")
        claimed_then_died_days_ago(run_id, "capture_fee")
        hold = StepCheckpoint.objects.get(run_id=run_id, name="charge_customer").output
        wait_for(
            lambda: (
                PaymentGateway.from_settings().payment(hold["payment_intent_id"]).status
                == "canceled"
            ),
            timeout=15,
            interval=0.2,
            what="the hold to lapse",
        )

        finished = play_out(run_id)

        assert finished.status == RunStatus.FAILED, finished.error
        assert "hold for the change fee ended" in finished.error
        ledger = server.ledger(workflow_id=run_id)
        assert ledger["payments"] == [] and ledger["refunds"] == []
        assert len(ledger["seat_reinstatements"]) == 1
        [email] = ledger["emails"]
        assert "given it back to you" in email["body"]
        assert "you have not been charged" in email["body"]
    finally:
        server.stop()


def test_fee_refund__first_attempt_days_ago__found_at_stripe_and_adopted_not_parked(
    partners: SandboxProcess, settings: Any
) -> None:
    """The fee refund was made, its worker died before recording it, and the run was found
    three days later, past Stripe's 24-hour key window: retrying blindly could refund twice,
    parking would wait for ever. Its reconcile finds the refund by its key and adopts it."""
    partners.set_fault(endpoint="crm.update", error_rate=1.0, error_status=400)  # after the capture
    run_id = submit("RKW001")
    run = step_until(run_id, "refund_fee@8")  # the compensation of the charge at 8
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

    finished = play_out(run_id)
    assert finished.status == RunStatus.FAILED, finished.error  # not NEEDS_ATTENTION
    undone = StepCheckpoint.objects.get(run_id=run_id, name="refund_fee")
    assert (undone.status, undone.attempts) == (StepStatus.COMPLETED, 2)
    ledger = partners.ledger(workflow_id=run_id)
    assert len(ledger["payments"]) == 1 and len(ledger["refunds"]) == 1  # refunded once
    assert undone.output["refund_id"] == ledger["refunds"][0]["id"]
