"""A cancelled flight while customers keep writing in (issue 40), on real workers against the
real sandbox, on Redis and on RabbitMQ: the flight's refunds, started in bulk as the
`flight_cancelled` run's children, run at batch priority, and a customer's refund sent from the
form meanwhile, at customer priority, completes while most of the batch is still running; and a
passenger who wrote in before the airline's notice keeps their booking to their own request
until it ended: the bulk start created the flight's refund of that booking WAITING for its
concurrency key, it started only after the passenger's own had ended, and it says the booking
was already changed.

Order is read from the runs' rows and events (the database's clock), never from timings.
FLIGHT_PASSENGERS and FLIGHT_CUSTOMER_EVERY_SECONDS in the environment run the acceptance at
scale by hand (docs/refunds.md, "A busy hour: customers first, one run per booking", gives
the command and the figures): a customer
every that many seconds for as long as the batch runs, each one's time from the form to its
end printed.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.testing.processes import WorkerProcess
from agentflow.testing.waiting import wait_for
from refunds import priorities
from refunds.models import RefundRequest
from refunds.sandbox.flights import manifest_references
from tests.support.airline_days import new_flight
from tests.support.refunds import finished, partner_effects, refund_worker_env, submit
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

BROKERS = ("redis", "rabbitmq")
PASSENGERS = int(os.environ.get("FLIGHT_PASSENGERS", "20"))
#: 0: one customer, sent as soon as the flight's refunds exist.
CUSTOMER_EVERY_SECONDS = float(os.environ.get("FLIGHT_CUSTOMER_EVERY_SECONDS", "0"))
SECRET = "whsec_airline_test"
DETAILS = "My mother died on Monday; the funeral is on the day of my flight."
#: Refunds of about a dozen partner calls each, on one worker of two processes, loaded machine.
DONE_SECONDS = max(300.0, PASSENGERS * 6.0)
#: Customers stop coming after this long even if the batch still runs: customers at a higher
#: priority take the worker first, so a worker they keep busy leaves the batch little.
CUSTOMERS_FOR_SECONDS = float(os.environ.get("FLIGHT_CUSTOMERS_FOR_SECONDS", str(DONE_SECONDS)))
#: The workers' lease: at scale, longer than the batch's queue wait (docs/refunds.md), or every
#: sweep publishes each queued refund again.
LEASE_SECONDS = os.environ.get("FLIGHT_LEASE_SECONDS", "5")


@pytest.fixture
def service(live_server: Any, settings: Any, clean_sandbox: SandboxProcess) -> SandboxProcess:
    """The refund service's web side (this process) taking the airline's notices."""
    settings.REFUNDS_AIRLINE_SECRET = SECRET
    settings.REFUNDS_AIRLINE_NOTICES_URL = f"{live_server.url}/refunds/airline/notices/"
    settings.SANDBOX_URL = clean_sandbox.url
    settings.STRIPE_API_BASE = clean_sandbox.url
    return clean_sandbox


@pytest.fixture
def worker(service: SandboxProcess, broker: Any) -> Iterator[WorkerProcess]:
    """One worker of two processes on the test's broker (this process publishes there too)."""
    env = refund_worker_env(
        service,
        CELERY_BROKER_URL=broker.url,
        REDIS_URL=broker.url,
        AGENTFLOW_LEASE_SECONDS=LEASE_SECONDS,
    )
    process = WorkerProcess(concurrency=2, env=env, beat=True)
    try:
        yield process.start(timeout=60)
    finally:
        process.kill()


def alive_while(worker: WorkerProcess, check: Any, what: str, timeout: float) -> Any:
    def look() -> Any:
        assert worker.alive(), worker.log_tail()
        return check()

    return wait_for(look, timeout=timeout, interval=0.2, what=what)


def batch_running(parent_id: str, *, but: str) -> bool:
    active = WorkflowRun.objects.filter(parent_id=parent_id, status__in=ACTIVE_RUN_STATUSES)
    return active.exclude(pk=but).exists()


def ended(run_id: str) -> WorkflowRun | None:
    run = WorkflowRun.objects.get(pk=run_id)
    return run if run.status not in ACTIVE_RUN_STATUSES else None


def latency(run_id: str) -> float:
    """Seconds from the form's request to the run's end."""
    run = WorkflowRun.objects.get(pk=run_id)
    return (run.updated_at - run.created_at).total_seconds()


@pytest.mark.parametrize("infra", BROKERS, indirect=True)
def test_flight_cancelled_while_customers_write_in__theirs_first__one_booking_at_a_time(
    service: SandboxProcess, worker: WorkerProcess, infra: str
) -> None:
    flight = new_flight("SK1236", weeks_ahead=6)
    passenger = manifest_references(flight.flight, flight.day, PASSENGERS)[0]
    quiet = submit("CUQ001")  # a customer's refund with nothing else to do: the reference
    assert finished(quiet, worker, timeout=120).status == RunStatus.COMPLETED
    # The first passenger wrote in before the airline's notice, asking for a fee waiver: their
    # run holds the booking while it waits for our team.
    own = submit(passenger, waiver_reason="bereavement", waiver_details=DETAILS)
    alive_while(
        worker,
        lambda: durable.snapshot(own).waiting_for == "approval",  # type: ignore[union-attr]
        "the passenger's own refund to wait for approval",
        timeout=120,
    )

    call_command(
        "sandbox",
        "cancel-flight",
        flight.flight,
        "--date",
        flight.date,
        "--passengers",
        str(PASSENGERS),
    )
    parent_id = WorkflowRun.objects.get(workflow="flight_cancelled").id
    kids = alive_while(
        worker,
        lambda: list(WorkflowRun.objects.filter(parent_id=parent_id)) or None,
        "the flight's refunds to be started",
        timeout=120,
    )
    customers = [submit("CU0000")]  # sent now: the whole batch is ahead of it in time

    # Started in bulk: every one at batch priority; the passenger's own booking's refund WAITING
    # for its key behind the request the passenger sent, the others admitted.
    assert len(kids) == PASSENGERS
    assert {k.priority for k in kids} == {priorities.BATCH}
    assert WorkflowRun.objects.get(pk=customers[0]).priority == priorities.CUSTOMER
    theirs = RefundRequest.objects.get(
        booking_reference=passenger, workflow_id__in=[k.id for k in kids]
    ).workflow_id
    held = durable.snapshot(str(theirs))
    assert held is not None and held.status == RunStatus.WAITING, held
    assert "same concurrency key" in held.held
    assert not StepCheckpoint.objects.filter(run_id=theirs).exists()

    stop = time.monotonic() + CUSTOMERS_FOR_SECONDS
    while (
        CUSTOMER_EVERY_SECONDS
        and time.monotonic() < stop
        and batch_running(parent_id, but=str(theirs))
    ):
        time.sleep(CUSTOMER_EVERY_SECONDS)
        customers.append(submit(f"CU{len(customers):04d}"))
    first = finished(customers[0], worker, timeout=DONE_SECONDS)
    assert first.status == RunStatus.COMPLETED, first.error
    # Then our team approves the passenger's waiver: their own refund goes on and ends.
    durable.approve(own, actor="ops@skyways.example", reason="We're sorry for your loss.")
    own_run = finished(own, worker, timeout=DONE_SECONDS)
    assert own_run.status == RunStatus.COMPLETED, own_run.error

    parent = alive_while(
        worker, lambda: ended(parent_id), "the flight's run to end", timeout=DONE_SECONDS
    )
    for customer in customers:
        assert finished(customer, worker, timeout=DONE_SECONDS).status == RunStatus.COMPLETED

    # Theirs first: when the first customer's refund completed, most of the batch sent before
    # it was still running (at one priority, it would have waited behind each of their steps).
    ends = {k.id: k.updated_at for k in WorkflowRun.objects.filter(parent_id=parent_id)}
    customer_end = WorkflowRun.objects.get(pk=customers[0]).updated_at
    ended_before = sum(1 for end in ends.values() if end <= customer_end)
    assert ended_before <= PASSENGERS // 2, (ended_before, PASSENGERS)

    # One booking at a time: the flight's refund of the passenger's booking was admitted once
    # their own had ended, started its first step after that, and touched nothing.
    own_end = WorkflowRun.objects.get(pk=own).updated_at
    admitted = RunEvent.objects.get(run_id=theirs, kind=RunEvent.Kind.RELEASED).at
    began = StepCheckpoint.objects.filter(run_id=theirs).order_by("seq").first()
    assert began is not None and own_end <= admitted <= began.started_at
    last_own = StepCheckpoint.objects.filter(run_id=own).order_by("-finished_at").first()
    assert last_own is not None and last_own.finished_at <= began.started_at
    flight_refund = finished(str(theirs), worker, timeout=60)
    assert flight_refund.status == RunStatus.FAILED
    assert "already" in flight_refund.error.lower(), flight_refund.error
    ledger = partner_effects(service, str(theirs))
    assert ledger["authorizations"] == [] and ledger["seat_cancellations"] == []

    # The parent completes once all its children have, the one that found the booking changed
    # reported as failed, the others with one payment and one boarding pass each.
    assert parent.status == RunStatus.COMPLETED, parent.error
    report = parent.steps.get(name="wait_for_refunds").output["payload"]
    assert report["counts"] == {RunStatus.COMPLETED: PASSENGERS - 1, RunStatus.FAILED: 1}
    for kid in kids:
        if kid.id != theirs:
            effects = partner_effects(service, kid.id)
            assert len(effects["payments"]) == 1 and len(effects["boarding_passes"]) == 1

    waits = [latency(c) for c in customers]
    batch = max(ends.values()) - min(k.created_at for k in kids)
    print(
        f"\n[{infra}] {PASSENGERS} passengers' refunds drained in {batch.total_seconds():.1f} s; "
        f"{len(customers)} customers' refunds meanwhile: median {statistics.median(waits):.1f} s, "
        f"max {max(waits):.1f} s (one alone: {latency(quiet):.1f} s); the first ended with "
        f"{ended_before} of the batch done"
    )
