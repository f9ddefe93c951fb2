"""The flight and date asked for are checked against the airline's schedule before anything
happens, in both engines: a past date, one beyond the airline's horizon or a flight that does
not fly that day fails the run with a sentence for the customer, and no partner effect."""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, timedelta
from typing import Any

import pytest

from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow.models import StepCheckpoint, WorkflowRun
from refunds.gateways import AirlineGateway
from refunds.models import RefundRequest
from refunds.sandbox import airline
from tests.support.airline_days import airline_today, day_off, new_flight
from tests.support.refunds import submit
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

EFFECTS = ("payments", "seat_cancellations", "boarding_passes", "crm_updates", "refunds")


#: Days from the airline's today (computed when the test runs, as the sandbox counts them).
NOT_SOLD = [
    pytest.param(
        "ZZ9999",
        lambda: airline_today() - timedelta(days=1),
        "that date has already passed",
        id="past",
    ),
    pytest.param(
        "SK1240",
        lambda: airline_today() + timedelta(days=airline.HORIZON_DAYS + 30),
        "the airline sells seats up to",
        id="beyond_horizon",
    ),
    pytest.param("SK1240", day_off, "in the airline's schedule", id="not_flying"),
]


def names(run_id: str) -> list[str]:
    return list(
        StepCheckpoint.objects.filter(run_id=run_id).order_by("seq").values_list("name", flat=True)
    )


def test_scheduled_flight__the_airline_answers_whether_and_why_not(partners) -> None:
    gateway = AirlineGateway.from_settings()

    sold = gateway.scheduled_flight("SK1240", new_flight("SK1240").date)
    gone = gateway.scheduled_flight("ZZ9999", "1999-01-01")
    later = gateway.scheduled_flight("SK1240", (airline_today() + timedelta(days=400)).isoformat())

    assert (sold.operates, sold.reason) == (True, "")
    assert (gone.operates, gone.reason) == (False, "past")
    assert (later.operates, later.reason) == (False, "beyond_horizon")
    last = airline_today() + timedelta(days=airline.HORIZON_DAYS)
    assert later.last_bookable_date == last.isoformat()  # counted from the airline's today


@pytest.mark.parametrize("engine_name", ["graph", "agent"])
@pytest.mark.parametrize(("flight", "day", "words"), NOT_SOLD)
def test_flight_not_sold__run_fails_readably_and_nothing_happens(
    drive: Callable[[str], WorkflowRun],
    partners: SandboxProcess,
    settings: Any,
    engine_name: str,
    flight: str,
    day: Callable[[], date],
    words: str,
) -> None:
    settings.REFUNDS_ENGINE = engine_name
    run_id = submit("SCH001", message=f"Please move me to flight {flight} on {day().isoformat()}.")

    run = drive(run_id, max_steps=80)

    assert run.status == RunStatus.FAILED
    assert run.error.startswith("check_flight: We ") and words in run.error, run.error
    assert "llm" not in names(run_id)  # the agent's model is never asked
    ledger = partners.ledger(workflow_id=run_id)
    assert all(ledger[kind] == [] for kind in EFFECTS), ledger
    snapshot = durable.snapshot(run_id)
    assert snapshot is not None
    [notice] = [step for step in snapshot.steps if step.name == "notify_failure"]
    assert words in notice.output["reason"]  # what the status page and the e-mail say


def test_flight_not_sold__status_page_tells_the_customer(
    drive: Callable[[str], WorkflowRun], partners: SandboxProcess, client: Any
) -> None:
    run_id = submit("SCH002", message="Please move me to flight ZZ9999 on 1999-01-01.")
    drive(run_id)
    refund = RefundRequest.objects.get(workflow_id=run_id)

    page = client.get(f"/refunds/{refund.public_id}/").content.decode()

    assert "that date has already passed" in page
