"""Engine hardening against real Postgres, in this process: the db-step race, partner-chosen
back-off, the key-age guard by default, and a renewer that outlives its connection."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.utils import timezone

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus, StepStatus
from agentflow._core import leases
from agentflow._core.registry import StepDef
from agentflow._engine import attempts, runtime
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.testing.waiting import wait_for
from tests.support import partner, workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


# --- finding 6: a duplicate delivery races a running db step ------------------------------------
def _waiting_on_a_lock() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0] > 0


def test_db_step__a_redelivered_copy_waits_for_the_running_one__never_fails_the_run() -> None:
    """The redelivery used to record the lost attempt without the run's lock; the running db
    step then met an IntegrityError on its checkpoint and the run FAILED as if it were a bug."""
    run_id = durable.start(workflows.slow_db_flow.name)

    def deliver(redelivered: bool) -> None:
        try:
            runtime.run_step(run_id, 1, redelivered=redelivered)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(deliver, False)
        wait_for(lambda: partner.executions(run_id), what="the db step to hold the run's lock")
        duplicate = pool.submit(deliver, True)
        wait_for(_waiting_on_a_lock, what="the redelivered copy to wait for the lock")
        partner.release(f"{run_id}/db")
        running.result(timeout=30)
        duplicate.result(timeout=30)

    cp = StepCheckpoint.objects.get(run_id=run_id, seq=1)
    assert (cp.status, cp.attempts) == (StepStatus.COMPLETED, 1)
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.RUNNING and run.current_seq == 2, run.error
    assert len(partner.executions(run_id)) == 1


# --- finding 7: the partner chooses the back-off ------------------------------------------------
@pytest.mark.parametrize("asked", ["inf", "1e12", "nan", "-5"])
def test_retry_after__inf_huge_nan_or_negative__clamped_to_the_max_backoff(
    asked: str, drive: Callable[[str], WorkflowRun], settings: Any
) -> None:
    """`inf` used to raise OverflowError in the wait (the task was acked, the attempt not
    counted); a huge finite value parked the run for years."""
    settings.AGENTFLOW_MAX_BACKOFF = 300
    run_id = durable.start(workflows.greedy.name, input={"retry_after": asked})

    run = drive(run_id)

    assert run.status == RunStatus.WAITING
    assert run.wake_at is not None
    assert run.wake_at <= timezone.now() + timedelta(seconds=300)
    cp = StepCheckpoint.objects.get(run_id=run_id, seq=1)
    assert (cp.status, cp.retryable, cp.attempts) == (StepStatus.FAILED, True, 1)
    assert cp.retry_at is not None and cp.retry_at == run.wake_at
    failed = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.ATTEMPT_FAILED)
    assert failed.data["attempt"] == 1 and failed.data["retry_at"] is not None


def test_retry_delay__is_always_finite_and_within_the_ceiling(settings: Any) -> None:
    settings.AGENTFLOW_MAX_BACKOFF = 60
    step = workflows.greedy.steps["charge"]
    for asked in (float("inf"), float("-inf"), float("nan"), 1e300, -1.0, None, "soon"):
        error = durable.RetryableStepError("429", retry_after_seconds=asked)  # type: ignore[arg-type]
        delay = attempts.retry_delay(step, 1, error)
        assert 0 <= delay <= 60, (asked, delay)
    asked_politely = durable.RetryableStepError("x", retry_after_seconds=42)
    assert attempts.retry_delay(step, 1, asked_politely) == 42


# --- finding 9: every effect step has a key window ----------------------------------------------
def _stale_claim(run_id: str, *, hours: float) -> StepCheckpoint:
    """The effect step's first attempt began `hours` ago and its owner vanished."""
    long_ago = timezone.now() - timedelta(hours=hours)
    StepCheckpoint.objects.filter(run_id=run_id, seq=2).update(
        first_started_at=long_ago,
        started_at=long_ago,
        lease_expires_at=long_ago,
        lease_lock=None,
    )
    return StepCheckpoint.objects.get(run_id=run_id, seq=2)


def test_key_window__an_effect_without_a_declared_window__never_retried_blindly_after_24_h(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """The age guard used to apply only to steps that declared a window."""
    run_id = durable.start(workflows.held.name)
    runtime.run_step(run_id, 1)
    state = store.state_load(run_id, 2)
    assert state is not None
    hold: StepDef = workflows.held.steps["hold"]
    assert store.step_claim(state, hold, 2, None) is not None  # the owner that vanished
    _stale_claim(run_id, hours=25)

    run = drive(run_id)

    assert run.status == RunStatus.NEEDS_ATTENTION
    assert "older than the partner's idempotency window (86400 s)" in run.error
    assert [r["step"] for r in partner.executions(run_id)] == ["prepare"]  # nothing re-sent
    assert partner.requests() == {}


# --- finding 10: the renewer outlives its connection --------------------------------------------
def _liveness_backend(key: int) -> int | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND classid::bigint = %s AND objid::bigint = %s AND objsubid = 1",
            [key >> 32, key & 0xFFFFFFFF],
        )
        row = cursor.fetchone()
    return row[0] if row else None


def test_renewer__its_connection_terminated__reconnects_relocks_and_keeps_renewing(
    settings: Any,
) -> None:
    settings.AGENTFLOW_LEASE_SECONDS = 1  # renewals every 0.33 s
    run_id = durable.start(workflows.race.name)
    state = store.state_load(run_id, 1)
    assert state is not None
    claim = store.step_claim(state, workflows.race.steps["hold"], 1, None)
    assert claim is not None
    token, key, _ = leases.current_owner()
    assert key is not None
    lost = threading.Event()

    def expiry() -> Any:
        return StepCheckpoint.objects.get(run_id=run_id, seq=1).lease_expires_at

    with leases.kept_alive(
        lambda conn: store.lease_renew(run_id, 1, claim.fence, conn=conn), lost.set
    ):
        first = _liveness_backend(key)
        assert first is not None
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [first])

        second = wait_for(
            lambda: (pid := _liveness_backend(key)) not in (None, first) and pid,
            what="the lock to be taken again on a new connection",
        )
        renewed = expiry()
        wait_for(lambda: expiry() > renewed, what="a renewal after the reconnect")
        assert _liveness_backend(key) == second

    assert not lost.is_set()
    assert leases.current_owner()[:2] == (token, key)


# --- cancel keeps no money (I8) -----------------------------------------------------------------
def test_cancel__a_waiting_run__asks_whether_the_step_happened_then_undoes_its_effects(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """confirm backs off after a 503: it may have happened until its reconcile says it did
    not (docs/protocol.md, "Unknown outcomes"), so the cancel asks first, then undoes book and
    charge."""
    run_id = durable.start(workflows.cancellable.name)
    assert drive(run_id).status == RunStatus.WAITING  # book and charge made; confirm backs off

    outcome = durable.cancel(run_id, actor="ops", reason="customer withdrew")
    run = drive(run_id)

    assert outcome is not None
    assert outcome.startswith("cancel requested: whether confirm took effect is unknown")
    assert run.status == RunStatus.CANCELLED and run.wake_at is None
    names = list(
        StepCheckpoint.objects.filter(run_id=run_id).order_by("seq").values_list("name", "status")
    )
    assert names == [
        ("book", StepStatus.COMPLETED),
        ("charge", StepStatus.COMPLETED),
        ("confirm", StepStatus.FAILED),
        ("refund", StepStatus.COMPLETED),
        ("unbook", StepStatus.COMPLETED),
        ("notify", StepStatus.COMPLETED),
    ]
    assert set(partner.effects()) == {durable.idempotency_key(run_id, s) for s in (1, 2, 4, 5, 6)}
    assert durable.snapshot(run_id).cancel_requested  # type: ignore[union-attr]


# --- issue 19 finding 1: cancel while the charge's outcome is unknown ---------------------------
def _undone(run_id: str) -> dict[str, str]:
    """Each compensation's name and the key of the call the engine handed it to undo."""
    rows = StepCheckpoint.objects.filter(run_id=run_id, name__in=("refund", "unbook"))
    return {cp.name: cp.output["undoes"] for cp in rows}


def test_cancel__the_charge_backing_off_after_the_partner_took_it__adopted_then_refunded(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """The charge was applied and its answer lost: FAILED retryable, the run WAITING. The
    cancel used to count only IN_PROGRESS steps as in flight and undo only COMPLETED ones:
    CANCELLED, the charge kept."""
    run_id = durable.start(workflows.lost_answer.name)
    assert drive(run_id).status == RunStatus.WAITING
    charge_key = durable.idempotency_key(run_id, 2)
    assert partner.effects()[charge_key] == 1  # the partner has the money

    outcome = durable.cancel(run_id, actor="ops", reason="customer withdrew")
    run = drive(run_id)

    assert outcome is not None and outcome.startswith("cancel requested: whether charge")
    assert run.status == RunStatus.CANCELLED, run.error
    charge = StepCheckpoint.objects.get(run_id=run_id, seq=2)
    assert (charge.status, charge.output) == (
        StepStatus.COMPLETED,
        {"key": charge_key, "replayed": True},
    )
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.RECONCILED, seq=2).exists()
    assert _undone(run_id) == {"refund": charge_key, "unbook": durable.idempotency_key(run_id, 1)}
    # book, charge, then from 4 on (3 stays confirm's, which never ran): refund, unbook, notify
    assert partner.effects() == {durable.idempotency_key(run_id, s): 1 for s in (1, 2, 4, 5, 6)}
    assert partner.execution_counts(run_id)[(run_id, 2, "charge")] == 1  # asked, never made again


def test_cancel__requested_while_the_charge_is_in_flight_then_it_times_out__refunded(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.lost_answer.name)
    runtime.run_step(run_id, 1)  # book
    state = store.state_load(run_id, 2)
    assert state is not None
    charge = workflows.lost_answer.steps["charge"]
    claim = store.step_claim(state, charge, 2, None)  # the charge is in flight...
    assert claim is not None
    charge_key = durable.idempotency_key(run_id, 2)
    partner.apply(charge_key)  # ...reaches the partner...

    outcome = durable.cancel(run_id, actor="ops", reason="customer withdrew")
    assert outcome is not None and outcome.startswith("cancel requested: charge is running")
    assert store.step_fail(  # ...and its answer times out: it backs off
        state,
        workflows.lost_answer,
        charge,
        2,
        claim=claim,
        seen=None,
        error="read timed out",
        retry_in_seconds=0.0,
    )
    run = drive(run_id)

    assert run.status == RunStatus.CANCELLED, run.error
    assert StepCheckpoint.objects.get(run_id=run_id, seq=2).status == StepStatus.COMPLETED
    assert _undone(run_id)["refund"] == charge_key
    assert partner.effects() == {durable.idempotency_key(run_id, s): 1 for s in (1, 2, 4, 5, 6)}


def test_cancel__the_partner_cannot_tell__parked_outcome_unknown_with_nothing_undone(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """cancellable's charge has no reconcile: parked IN_PROGRESS "outcome unknown", a cancel
    cannot learn more, so it parks again with the reason rather than guess either way."""
    run_id = durable.start(workflows.cancellable.name)
    runtime.run_step(run_id, 1)
    state = store.state_load(run_id, 2)
    assert state is not None
    claim = store.step_claim(state, workflows.cancellable.steps["charge"], 2, None)
    assert claim is not None
    assert store.run_park(run_id, 2, "outcome unknown: test", fence=claim.fence, claimed=True)

    outcome = durable.cancel(run_id, actor="ops", reason="stop it")
    run = drive(run_id)

    assert outcome is not None and outcome.startswith("cancel requested: whether charge")
    assert run.status == RunStatus.NEEDS_ATTENTION
    assert run.error.startswith(
        "outcome unknown: charge may or may not have taken effect: the run was cancelled and "
        "there is no way to ask the partner"
    )
    assert StepCheckpoint.objects.filter(run_id=run_id, seq__gt=2).count() == 0  # nothing undone
    assert set(partner.effects()) == {durable.idempotency_key(run_id, 1)}
    with pytest.raises(durable.ActionRefused, match="waits to learn whether charge took effect"):
        durable.cancel(run_id, actor="ops", reason="again")


def test_cancel__a_step_in_flight__it_finishes_first_and_is_undone_too(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """Undoing while the charge is in flight would miss it: the cancel waits for it."""
    run_id = durable.start(workflows.cancellable.name)
    runtime.run_step(run_id, 1)  # book
    state = store.state_load(run_id, 2)
    assert state is not None
    charge = workflows.cancellable.steps["charge"]
    claim = store.step_claim(state, charge, 2, None)  # the charge is in flight...
    assert claim is not None

    outcome = durable.cancel(run_id, actor="ops", reason="customer withdrew")
    assert outcome is not None and outcome.startswith("cancel requested: charge is running")
    assert store.step_complete(state, workflows.cancellable, charge, 2, claim, {"paid": True})
    run = drive(run_id)  # ...finishes, and the next step boundary carries the cancel out

    assert run.status == RunStatus.CANCELLED
    names = list(
        StepCheckpoint.objects.filter(run_id=run_id).order_by("seq").values_list("name", flat=True)
    )
    assert names == ["book", "charge", "refund", "unbook", "notify"]


# --- the database goes away between an effect and its record ------------------------------------
def test_completion__the_database_connection_lost_after_the_effect__recorded_on_a_new_one(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """Only this process knows the effect's result: it waits the lost connection out rather
    than leave the step to a takeover after the lease."""
    run_id = durable.start(workflows.lost_db.name)

    run = drive(run_id)

    assert run.status == RunStatus.COMPLETED, run.error
    charge = StepCheckpoint.objects.get(run_id=run_id, seq=1)
    assert (charge.status, charge.attempts) == (StepStatus.COMPLETED, 1)
    assert charge.output == {"key": durable.idempotency_key(run_id, 1), "replayed": False}
    assert not RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.TAKEOVER).exists()
