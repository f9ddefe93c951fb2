"""Refunds as the crash and outage tests drive them: a request sent by the booking's owner, a
worker wired to the partner sandbox, waiting for a run, and its partner ledger checked for I1."""

from __future__ import annotations

from typing import Any

import requests
from django.conf import settings

from agentflow import durable
from agentflow.testing.processes import WorkerProcess
from agentflow.testing.waiting import wait_for
from config.celery_app import app
from refunds import services
from refunds.sandbox.airline import owner_of
from tests.support.airline_days import new_flight
from tests.support.processes import worker_database_url
from tests.support.sandbox import SandboxProcess

#: What a customer writes by default (`NewFlight.words`).
WORDS = "Hi, please move me to {flight} on {date}. Thanks!"
EFFECT_LISTS = (
    "authorizations",
    "payments",
    "authorization_cancels",
    "refunds",
    "seat_cancellations",
    "seat_reinstatements",
    "boarding_passes",
    "crm_updates",
)


def submit(
    reference: str,
    *,
    last_name: str | None = None,
    email: str | None = None,
    message: str | None = None,
    waiver_reason: str = "",
    waiver_details: str = "",
) -> str:
    """What the form does once it has a valid request: the request row and its run, in one
    transaction (the booking's owner unless told otherwise; a fee waiver if asked; unless told
    otherwise, asking for `new_flight()`, some weeks after the airline's today). Returns the
    run id."""
    owner = owner_of(reference)
    request = services.refund_request_create(
        email=email or owner.email,
        booking_reference=reference,
        last_name=last_name or owner.last_name,
        message=new_flight().words(WORDS) if message is None else message,
        submission_token=f"token-{reference}",
        client_ip="127.0.0.1",
        waiver_reason=waiver_reason,
        waiver_details=waiver_details,
    )
    assert request.workflow_id is not None
    return request.workflow_id


def refund_worker_env(sandbox: SandboxProcess, **overrides: str) -> dict[str, str]:
    """A refund worker's environment: the test database and broker, the sandbox as every
    partner, its calendar as this process counts it (SANDBOX_TODAY_OFFSET_DAYS, which a test
    may have moved), no rate limits; `overrides` last."""
    broker = app.conf.broker_write_url or app.conf.broker_url
    return {
        "DATABASE_URL": worker_database_url(),
        "CELERY_BROKER_URL": broker,
        "REDIS_URL": broker,
        "AGENTFLOW_VAR_DIR": str(settings.VAR_DIR),
        "AGENTFLOW_WORKFLOW_MODULES": "",
        "AGENTFLOW_LEASE_SECONDS": "5",
        "SANDBOX_URL": sandbox.url,
        "SANDBOX_SMTP_PORT": str(sandbox.smtp_port),
        "STRIPE_API_BASE": sandbox.url,
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": str(sandbox.smtp_port),
        "REFUNDS_SUBMIT_LIMIT": "0",
        "SANDBOX_TODAY_OFFSET_DAYS": str(settings.SANDBOX_TODAY_OFFSET_DAYS),
        **overrides,
    }


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


def money_kept(ledger: dict[str, Any]) -> int:
    """Cents a run keeps, counted at the partner: payments (captured) minus refunds."""
    return sum(p["amount"] for p in ledger["payments"]) - sum(
        r["amount"] for r in ledger["refunds"]
    )


def holds_left(ledger: dict[str, Any]) -> list[dict[str, Any]]:
    """Fee holds still on the card (neither captured nor released)."""
    return [a for a in ledger["authorizations"] if a["status"] == "requires_capture"]


def seat_held(sandbox: SandboxProcess, reference: str) -> bool:
    """Whether the airline says the booking still holds its seat."""
    booking = requests.get(f"{sandbox.url}/airline/bookings/{reference}", timeout=10)
    return bool(booking.json()["seat_held"])


def partner_effects(sandbox: SandboxProcess, run_id: str) -> dict[str, Any]:
    """This run's ledger, after checking I1: one effect per idempotency key, in every list."""
    ledger = sandbox.ledger(workflow_id=run_id)
    for kind in EFFECT_LISTS:
        keys = [entry["idempotency_key"] for entry in ledger[kind]]
        assert len(keys) == len(set(keys)), f"{kind}: {keys}"
        assert all(key.startswith(f"{run_id}_") for key in keys), keys  # _step_N or _bB_step_N
    return ledger
