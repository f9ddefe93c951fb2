"""A failed change leaves the customer as before (issue 15, finding 5), in both engines: the
fee is only held until the change is made, a declined card stops the run before the seat is
touched, and a seat released before a later failure is given back. Real workers, the real
sandbox, counted at its ledger; the status page and the e-mail say what happened."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import Client

from agentflow import durable
from agentflow.testing.processes import WorkerProcess
from refunds.models import RefundRequest
from tests.support.refunds import (
    finished,
    holds_left,
    money_kept,
    partner_effects,
    refund_worker_env,
    seat_held,
    submit,
)
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

ENGINES = ["graph", "agent"]
StartWorker = Callable[[str], WorkerProcess]


@pytest.fixture
def start_worker(
    clean_sandbox: SandboxProcess, transactional_db: None, settings: Any
) -> Iterator[StartWorker]:
    """One worker running refunds in `engine` (the agent with its scripted planner); SIGKILLed
    at teardown, before the test database is flushed."""
    started: list[WorkerProcess] = []

    def start(engine: str) -> WorkerProcess:
        settings.REFUNDS_ENGINE = engine  # what the form starts, here as in the worker
        env = refund_worker_env(
            clean_sandbox,
            REFUNDS_ENGINE=engine,
            REFUNDS_PARTNER_MAX_ATTEMPTS="3",
            REFUNDS_PARTNER_RETRY_BASE_SECONDS="0.25",
        )
        worker = WorkerProcess(concurrency=2, env=env, beat=True)
        started.append(worker)
        return worker.start(timeout=60)

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()


def customer_view(run_id: str) -> dict[str, Any]:
    """The status page's JSON, as the customer's browser polls it."""
    refund = RefundRequest.objects.get(workflow_id=run_id)
    return Client().get(f"/refunds/{refund.public_id}/status.json").json()["customer"]


@pytest.mark.parametrize("engine", ENGINES)
def test_declined_card__no_money_kept_and_the_seat_still_held(
    engine: str, start_worker: StartWorker, clean_sandbox: SandboxProcess
) -> None:
    reference = f"DEC{engine[0].upper()}01"
    worker = start_worker(engine)
    run_id = submit(reference)

    run = finished(run_id, worker, timeout=60)

    assert run.status == durable.RunStatus.FAILED
    assert run.error.endswith("Your card was declined."), run.error
    ledger = partner_effects(clean_sandbox, run_id)
    assert money_kept(ledger) == 0 and holds_left(ledger) == []
    assert ledger["seat_cancellations"] == [] and ledger["boarding_passes"] == []
    assert seat_held(clean_sandbox, reference)  # the airline's own word
    [email] = ledger["emails"]
    assert email["subject"] == f"We couldn't change your booking {reference}"
    assert "Why: Your card was declined." in email["body"]
    assert "your booking is exactly as it was" in email["body"]
    assert "You have not been charged anything." in email["body"]
    view = customer_view(run_id)
    assert view["outcome"] == "failed"
    assert view["message"].startswith("Your card was declined. You have not been charged")
    assert any(line.startswith("Your booking was not changed") for line in view["details"])


@pytest.mark.parametrize("engine", ENGINES)
def test_boarding_pass_refused__hold_released_and_the_seat_given_back(
    engine: str, start_worker: StartWorker, clean_sandbox: SandboxProcess
) -> None:
    reference = f"RNS{engine[0].upper()}01"
    clean_sandbox.set_fault(endpoint="airline.boarding_pass", error_rate=1.0, error_status=400)
    worker = start_worker(engine)
    run_id = submit(reference)

    run = finished(run_id, worker, timeout=60)

    assert run.status == durable.RunStatus.FAILED
    ledger = partner_effects(clean_sandbox, run_id)
    assert money_kept(ledger) == 0 and holds_left(ledger) == []
    assert ledger["payments"] == [] and ledger["refunds"] == []  # held, never taken
    [hold] = ledger["authorizations"]
    assert [c["id"] for c in ledger["authorization_cancels"]] == [hold["id"]]
    [released] = ledger["seat_cancellations"]
    [back] = ledger["seat_reinstatements"]
    assert back["seat"] == released["seat"]
    assert seat_held(clean_sandbox, reference)
    [email] = ledger["emails"]
    assert "we have given it back to you" in email["body"]
    assert "released the hold: you have not been charged" in email["body"]
    view = customer_view(run_id)
    assert view["outcome"] == "failed"
    assert "the hold on your card was released" in view["message"]
    assert "refunded" not in view["headline"]
