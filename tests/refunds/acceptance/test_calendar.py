"""A year from now the demo still works: with the sandbox's today moved a year ahead, refunds of
random bookings complete, in both engines, on real workers against a real sandbox.

Bookings live in the airline's calendar, so one a customer keeps (asking for no other flight or
date) is still sold, and one a customer moves goes to a day counted from the airline's today.
The references are random; the seed is in every failure message.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from agentflow import durable
from agentflow.testing.processes import WorkerProcess
from refunds.chaos import traffic
from refunds.sandbox import airline
from tests.support.airline_days import airline_today
from tests.support.refunds import finished, partner_effects, refund_worker_env, submit
from tests.support.sandbox import SandboxProcess, start_sandbox

pytestmark = pytest.mark.django_db(transaction=True)

#: How far the sandbox's today is moved, on top of whatever SANDBOX_TODAY_OFFSET_DAYS says.
A_YEAR = 365
#: A customer who keeps their flight and date: the new boarding pass is for the booking's own.
KEEP_MY_FLIGHT = "Hi, could I have another seat on the flight I'm booked on? Happy to pay the fee."


@pytest.fixture
def year_ahead(tmp_path: Path, settings: Any) -> Iterator[SandboxProcess]:
    """A sandbox of its own whose airline's today is a year after the suite's, and this
    process counting days from that today too."""
    settings.SANDBOX_TODAY_OFFSET_DAYS += A_YEAR
    server = start_sandbox(tmp_path / "sandbox")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def worker(
    year_ahead: SandboxProcess, transactional_db: None, settings: Any, request: Any
) -> Iterator[WorkerProcess]:
    engine = request.param
    settings.REFUNDS_ENGINE = engine  # what the form starts, here as in the worker
    process = WorkerProcess(
        concurrency=2, env=refund_worker_env(year_ahead, REFUNDS_ENGINE=engine), beat=True
    )
    try:
        yield process.start(timeout=60)
    finally:
        process.kill()


def _sold_until(sandbox: SandboxProcess) -> date:
    """The last day the sandbox's airline sells, as its schedule says."""
    answer = requests.get(
        f"{sandbox.url}/airline/schedule",
        params={"flight": "SK1240", "date": airline_today().isoformat()},
        timeout=10,
    ).json()
    return date.fromisoformat(answer["last_bookable_date"])


@pytest.mark.parametrize("worker", ["graph", "agent"], indirect=True)
def test_a_year_ahead__refunds_of_random_bookings_complete(
    worker: WorkerProcess, year_ahead: SandboxProcess
) -> None:
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    keeping, moving = traffic.customers(rng, 2, today=airline_today())  # random owners
    flight = f"SK{rng.randint(100, 9999)}"
    day = airline.next_operating_day(flight, airline_today() + timedelta(days=rng.randint(14, 300)))
    words = f"Please move me to {flight} on {day.isoformat()}, thanks."
    why = f"seed {seed}: {keeping.booking_reference} keeps its flight, {moving.booking_reference}"
    assert airline_today() >= airline.today() + timedelta(days=A_YEAR)  # this process's too
    last_sold = airline_today() + timedelta(days=airline.HORIZON_DAYS)
    assert _sold_until(year_ahead) == last_sold  # the sandbox's today is a year ahead
    booked = _booking(year_ahead, keeping.booking_reference)

    kept = submit(keeping.booking_reference, message=KEEP_MY_FLIGHT)
    moved = submit(moving.booking_reference, message=words)
    runs = {run_id: finished(run_id, worker, timeout=90) for run_id in (kept, moved)}

    for run_id, run in runs.items():
        assert run.status == durable.RunStatus.COMPLETED, f"{why}: {run.error}"
        ledger = partner_effects(year_ahead, run_id)
        assert len(ledger["payments"]) == len(ledger["boarding_passes"]) == 1, why
    [kept_pass] = partner_effects(year_ahead, kept)["boarding_passes"]
    [moved_pass] = partner_effects(year_ahead, moved)["boarding_passes"]
    assert (kept_pass["flight"], kept_pass["date"]) == (booked["flight"], booked["date"]), why
    assert (moved_pass["flight"], moved_pass["date"]) == (flight, day.isoformat()), why
    # The booking kept was a year on too: in the airline's calendar, sold on its today.
    assert airline_today() < date.fromisoformat(booked["date"]) <= last_sold, why


def _booking(sandbox: SandboxProcess, reference: str) -> dict[str, Any]:
    answer = requests.get(f"{sandbox.url}/airline/bookings/{reference}", timeout=10)
    answer.raise_for_status()
    return answer.json()
