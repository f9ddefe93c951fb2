"""The nightly reconciliation against the sandbox (issue 41, docs/refunds.md "Reconciliation"):
a day of refunds made by a real worker, the schedule's 02:00 slot started by its beat, and
Stripe's day read through the real `stripe` library.

"Yesterday": the refunds are made today (UTC) in the sandbox, and the worker's schedules read
their clock from a file (AGENTFLOW_SCHEDULE_CLOCK_FILE, honoured with AGENTFLOW_FAULTS=1) that
the test sets to tomorrow 02:00: the slot that reconciles today. A day with one payment made
behind the service's back and one run's payment removed parks listing exactly those two, with
amounts; a clean day completes; the e-mail to finance says which.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
import stripe

from agentflow import durable
from agentflow.models import ScheduleSlot, ScheduleState
from agentflow.testing.processes import WorkerProcess
from agentflow.testing.waiting import wait_for
from tests.support.refunds import finished, refund_worker_env, submit
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

SCHEDULE = "reconcile_payments_nightly"
FINANCE = "finance@agentflow.test"
SLOW = 90.0


def today_utc() -> datetime:
    """Today, UTC, with the refunds safely inside it: a test started in the last three
    minutes of a day waits for the next, so every payment it makes is on one day."""
    now = datetime.now(UTC)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    if midnight - now < timedelta(minutes=3):
        time.sleep((midnight - now).total_seconds() + 1)
        now = datetime.now(UTC)
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture
def night(
    clean_sandbox: SandboxProcess, tmp_path: Path
) -> Iterator[tuple[WorkerProcess, Callable[[datetime], None], datetime]]:
    """A refund worker with its beat; its schedules' clock at 01:59:30 tomorrow."""
    day = today_utc()
    clock = tmp_path / "schedule-clock"

    def move(to: datetime) -> None:
        clock.write_text(to.isoformat())

    move(day + timedelta(days=1, hours=1, minutes=59, seconds=30))
    env = refund_worker_env(
        clean_sandbox,
        AGENTFLOW_FAULTS="1",
        AGENTFLOW_SCHEDULE_CLOCK_FILE=str(clock),
        AGENTFLOW_SWEEP_INTERVAL="1",
        REFUNDS_FINANCE_EMAIL=FINANCE,
    )
    worker = WorkerProcess(concurrency=2, env=env, beat=True).start(timeout=60)
    try:
        wait_for(
            lambda: ScheduleState.objects.filter(name=SCHEDULE).exists(),
            timeout=SLOW,
            what="the beat to see the nightly schedule",
        )
        yield worker, move, day
    finally:
        worker.kill()


def a_day_of_refunds(worker: WorkerProcess, sandbox: SandboxProcess) -> dict[str, str]:
    """Two refunds that take their fee: run id -> the payment intent it captured."""
    taken = {}
    for reference in ("RCN001", "RCN002"):
        run_id = submit(reference)
        assert finished(run_id, worker, timeout=SLOW).status == durable.RunStatus.COMPLETED
        [payment] = sandbox.ledger(workflow_id=run_id)["payments"]
        taken[run_id] = payment["id"]
    return taken


def reconcile(worker: WorkerProcess, move: Callable[[datetime], None], day: datetime) -> Any:
    """02:00 tomorrow: the beat starts the slot; wait for where its run stops."""
    move(day + timedelta(days=1, hours=2, seconds=30))
    row = wait_for(
        lambda: ScheduleSlot.objects.filter(schedule=SCHEDULE, outcome="started").first(),
        timeout=SLOW,
        what="the 02:00 slot to start",
    )
    assert row.slot == day + timedelta(days=1, hours=2)

    def stopped() -> durable.RunSnapshot | None:
        assert worker.alive(), worker.log_tail()
        run = durable.snapshot(row.run_id)
        parked = run is not None and run.status == durable.RunStatus.NEEDS_ATTENTION
        return run if run is not None and (run.finished or parked) else None

    return wait_for(stopped, timeout=SLOW, what="the reconciliation to stop")


def output(run: durable.RunSnapshot, step: str) -> Any:
    [found] = [s for s in run.steps if s.name == step]
    return found.output


def test_a_day_with_two_mismatches__parks_listing_exactly_those_two(
    night: Any, clean_sandbox: SandboxProcess
) -> None:
    worker, move, day = night
    taken = a_day_of_refunds(worker, clean_sandbox)
    (kept_run, kept), (lost_run, lost) = taken.items()
    client = stripe.StripeClient("sk_test_behind", base_addresses={"api": clean_sandbox.url})
    behind = client.v1.payment_intents.create(
        {
            "amount": 4200,
            "currency": "usd",
            "payment_method": "pm_card_visa",
            "payment_method_types": ["card"],
            "confirm": True,
        }
    ).id
    forgot = requests.post(f"{clean_sandbox.url}/_sandbox/forget", json={"id": lost}, timeout=10)
    assert forgot.json()["forgotten"] >= 1

    run = reconcile(worker, move, day)

    assert run.status == durable.RunStatus.NEEDS_ATTENTION
    result = output(run, "match_runs")
    assert result["day"] == day.date().isoformat()
    assert [(e["id"], e["run_id"]) for e in result["matched"]] == [(kept, kept_run)]
    assert [(e["id"], e["stripe_cents"], e["run_id"]) for e in result["payment_without_run"]] == [
        (behind, 4200, None)
    ]
    [gone] = result["run_without_payment"]
    assert (gone["id"], gone["run_id"], gone["stripe_cents"]) == (lost, lost_run, None)
    assert gone["run_cents"] > 0 and result["amount_differs"] == []
    assert run.error.startswith(f"settle: 2 unmatched on {day.date().isoformat()}: ")
    assert behind in run.error and lost in run.error and "$42.00" in run.error
    [mail] = [m for m in clean_sandbox.ledger()["emails"] if m["to"] == [FINANCE]]
    assert mail["subject"].endswith(": 2 unmatched, waiting for an operator")
    assert behind in mail["body"] and lost in mail["body"] and "$42.00" in mail["body"]


def test_a_clean_day__completes_and_tells_finance(
    night: Any, clean_sandbox: SandboxProcess
) -> None:
    worker, move, day = night
    taken = a_day_of_refunds(worker, clean_sandbox)

    run = reconcile(worker, move, day)

    assert run.status == durable.RunStatus.COMPLETED
    result = output(run, "match_runs")
    assert sorted(e["id"] for e in result["matched"]) == sorted(taken.values())
    assert output(run, "settle") == {"clean": True, "matched": 2}
    [mail] = [m for m in clean_sandbox.ledger()["emails"] if m["to"] == [FINANCE]]
    assert mail["subject"] == f"Reconciliation {day.date().isoformat()}: clean, 2 matched"
    # Read only: nothing at Stripe but the two fees the refunds took.
    ledger = clean_sandbox.ledger()
    assert len(ledger["payments"]) == 2 and ledger["refunds"] == []
