"""A cancelled flight (issue 40) on real workers against the real sandbox: `manage.py sandbox
cancel-flight` makes the sandbox airline cancel it and send its signed notice to the refund
service (a live server), whose `flight_cancelled` run reads the manifest, starts one refund per
passenger as its children and waits for them all: every passenger's refund completes with one
payment and one boarding pass, the parent's counts match the sandbox's ledger, and operations
get the outcome by e-mail. Cancelled half-way, the refunds not yet charged are cancelled, the
charged ones given their fee back with their seats, and the parent ends CANCELLED.

PASSENGERS passengers here for the suite's time (FLIGHT_PASSENGERS in the environment for
more; docs/refunds.md gives the figure for 300)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow.models import WorkflowRun
from agentflow.testing.processes import WorkerProcess
from agentflow.testing.waiting import wait_for
from refunds.models import RefundRequest
from refunds.sandbox.flights import manifest_references
from tests.support.airline_days import new_flight
from tests.support.refunds import holds_left, money_kept, partner_effects, refund_worker_env
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

PASSENGERS = int(os.environ.get("FLIGHT_PASSENGERS", "20"))
SECRET = "whsec_airline_test"
#: Refunds of about a dozen partner calls each, on one worker of two processes, loaded machine.
DONE_SECONDS = max(240.0, PASSENGERS * 6.0)


@pytest.fixture
def service(live_server: Any, settings: Any, clean_sandbox: SandboxProcess) -> SandboxProcess:
    """The refund service's web side (this process) taking the airline's notices, and its
    partner settings pointed at the sandbox."""
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


def cancel_flight() -> tuple[str, str, str]:
    """Cancel SK1236 some weeks ahead through the command; the parent run's id, flight, day."""
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
    return parent.id, flight.flight, flight.date


def children(parent_id: str) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(parent_id=parent_id))


def ended(run_id: str, worker: WorkerProcess, timeout: float) -> WorkflowRun:
    def done() -> WorkflowRun | None:
        assert worker.alive(), worker.log_tail()
        run = WorkflowRun.objects.get(pk=run_id)
        return run if run.status not in ACTIVE_RUN_STATUSES else None

    return wait_for(done, timeout=timeout, interval=0.5, what=f"run {run_id} to end")


def test_flight_cancelled__every_passengers_refund_completes_once__counts_match_the_ledger(
    service: SandboxProcess, worker: WorkerProcess
) -> None:
    started = time.monotonic()
    parent_id, flight, day = cancel_flight()

    parent = ended(parent_id, worker, DONE_SECONDS)
    took = time.monotonic() - started

    assert parent.status == RunStatus.COMPLETED, parent.error
    kids = children(parent_id)
    assert len(kids) == PASSENGERS
    assert {k.status for k in kids} == {RunStatus.COMPLETED}
    references = set(
        manifest_references(flight, new_flight("SK1236", weeks_ahead=6).day, PASSENGERS)
    )
    requests = RefundRequest.objects.filter(workflow_id__in=[k.id for k in kids])
    assert {r.booking_reference for r in requests} == references
    for kid in kids:
        ledger = partner_effects(service, kid.id)  # one effect per key, in every list
        assert len(ledger["payments"]) == 1
        assert len(ledger["boarding_passes"]) == 1
        assert ledger["boarding_passes"][0]["flight"] == flight
    whole = service.ledger()
    payments = [p for p in whole["payments"] if p["workflow_id"] in {k.id for k in kids}]
    report = parent.steps.get(name="wait_for_refunds").output["payload"]
    assert report["counts"] == {RunStatus.COMPLETED: len(payments)}
    assert durable.snapshot(parent_id).children == {RunStatus.COMPLETED: PASSENGERS}  # type: ignore[union-attr]
    [mail] = service.ledger(workflow_id=parent_id)["emails"]
    assert mail["subject"] == f"{flight} {day} cancelled: {PASSENGERS} refunds"
    assert f"completed: {PASSENGERS}" in mail["body"]
    assert f"fees taken: ${PASSENGERS * 45:,}.00" in mail["body"]
    # The same notice again (the airline's retry): the same run, nothing started twice.
    call_command("sandbox", "cancel-flight", flight, "--date", day, "--passengers", str(PASSENGERS))
    assert WorkflowRun.objects.filter(workflow="flight_cancelled").count() == 1
    print(f"\n{PASSENGERS} passengers' refunds, notice to operations e-mail: {took:.1f} s")


def test_flight_cancelled__parent_cancelled_halfway__money_invariant_per_child(
    service: SandboxProcess, worker: WorkerProcess
) -> None:
    # Each fee hold takes a second: the refunds go past it a few at a time, so the cancel finds
    # some charged and some not charged yet.
    service.set_fault(endpoint="payment_intents.create", latency_ms=1000)
    parent_id, _, _ = cancel_flight()

    def halfway() -> bool:
        return len(service.ledger()["authorizations"]) >= PASSENGERS // 5

    wait_for(halfway, timeout=DONE_SECONDS, interval=0.2, what="a fifth of the fees held")
    durable.cancel(parent_id, actor="ops", reason="the airline restored the flight")

    parent = ended(parent_id, worker, DONE_SECONDS)
    kids = [ended(k.id, worker, DONE_SECONDS) for k in children(parent_id)]

    assert parent.status == RunStatus.CANCELLED
    assert {k.status for k in kids} <= {RunStatus.COMPLETED, RunStatus.CANCELLED}
    cancelled = [k for k in kids if k.status == RunStatus.CANCELLED]
    assert cancelled, "every refund completed before the cancel reached them"
    for kid in kids:
        ledger = partner_effects(service, kid.id)
        assert holds_left(ledger) == []
        if kid.status == RunStatus.COMPLETED:
            assert money_kept(ledger) == 4500
            assert len(ledger["boarding_passes"]) == 1
        else:
            assert money_kept(ledger) == 0  # never charged, or refunded
            cancelled_seats = len(ledger["seat_cancellations"])
            assert len(ledger["seat_reinstatements"]) == cancelled_seats  # seat given back
    held = sum(1 for k in cancelled if partner_effects(service, k.id)["authorizations"])
    assert 0 < held < len(cancelled), "the cancel found none, or every one, charged"
    print(
        f"\ncancelled half-way: {len(kids) - len(cancelled)} completed, {len(cancelled)} "
        f"cancelled ({held} of them after their fee was held)"
    )
