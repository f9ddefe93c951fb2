"""The airline's signed flight notices (issue 40): a notice signed with REFUNDS_AIRLINE_SECRET
starts one `flight_cancelled` run, once per notice id; anything else is refused with a 4xx and
starts nothing; the run's steps read the sandbox's manifest and start a refund per passenger,
once, whatever replays the step; and its page in the console links parent and children."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import pytest
import requests
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse

from agentflow import durable, webhooks
from agentflow._base.states import RunStatus
from agentflow._engine import runtime
from agentflow.models import WorkflowRun
from agentflow.testing import capture_messages
from refunds.models import RefundRequest
from refunds.sandbox import airline
from refunds.sandbox.flights import manifest_references
from tests.support.airline_days import new_flight
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

SECRET = "whsec_airline_test"
URL = "/refunds/airline/notices/"


def notice(flight: str = "SK1236", day: str = "2027-03-16", **extra: Any) -> bytes:
    body = {
        "id": f"flight-cancelled:{flight}:{day}",
        "type": "flight.cancelled",
        "flight": flight,
        "date": day,
        **extra,
    }
    return json.dumps(body).encode()


def post(body: bytes, *, secret: str = SECRET, at: int | None = None) -> Any:
    header = webhooks.sign(secret, body, timestamp=at or int(time.time()))
    return Client().post(
        URL, body, content_type="application/json", headers={"Agentflow-Signature": header}
    )


@pytest.fixture
def airline_secret(settings: Any) -> None:
    settings.REFUNDS_AIRLINE_SECRET = SECRET


@pytest.mark.usefixtures("airline_secret")
def test_notice__signed__starts_one_run_per_notice_id() -> None:
    with capture_messages():
        first = post(notice())
        again = post(notice())  # the airline's retry, signed afresh

    assert first.status_code == again.status_code == 200
    assert first.json()["run_id"] == again.json()["run_id"]
    run = WorkflowRun.objects.get(workflow="flight_cancelled")
    assert run.input == {
        "flight": "SK1236",
        "date": "2027-03-16",
        "notice": "flight-cancelled:SK1236:2027-03-16",
    }


@pytest.mark.usefixtures("airline_secret")
@pytest.mark.parametrize(
    ("body", "secret", "age", "status"),
    [
        (notice(), "whsec_someone_else", 0, 400),
        (notice(), SECRET, 3600, 400),
        (b"not json", SECRET, 0, 400),
        (notice(type="flight.delayed"), SECRET, 0, 400),
        (notice(flight="LH400"), SECRET, 0, 400),
        (notice(day="16/03/2027"), SECRET, 0, 400),
    ],
)
def test_notice__refused__4xx_and_nothing_started(
    body: bytes, secret: str, age: int, status: int
) -> None:
    answer = post(body, secret=secret, at=int(time.time()) - age)

    assert answer.status_code == status
    assert "error" in answer.json()
    assert not WorkflowRun.objects.exists()


def test_notice__no_secret_set__404(settings: Any) -> None:
    settings.REFUNDS_AIRLINE_SECRET = ""
    assert post(notice()).status_code == 404
    assert not WorkflowRun.objects.exists()


def test_flight_cancelled__starts_a_refund_per_passenger_once__console_links_them(
    partners: SandboxProcess, admin_client: Client
) -> None:
    flight = new_flight("SK1236", weeks_ahead=6)
    requests.post(
        f"{partners.url}/_sandbox/airline/cancel-flight",
        json={"flight": flight.flight, "date": flight.date, "passengers": 7},
        timeout=10,
    ).raise_for_status()
    parent_id = durable.start(
        "flight_cancelled", input={"flight": flight.flight, "date": flight.date, "notice": "n-1"}
    )
    with capture_messages():
        runtime.run_step(parent_id, 1)  # read_manifest
        runtime.run_step(parent_id, 2)  # start_refunds
        runtime.run_step(parent_id, 2)  # again (a redelivery): nothing new

    kids = WorkflowRun.objects.filter(parent_id=parent_id)
    assert kids.count() == 7
    requests_made = RefundRequest.objects.filter(workflow_id__in=kids.values("id"))
    assert sorted(r.booking_reference for r in requests_made) == sorted(
        manifest_references(flight.flight, flight.day, 7)
    )
    moved = airline.next_operating_day(flight.flight, flight.day + timedelta(days=1))
    assert {r.message for r in requests_made} == {
        f"My flight {flight.flight} was cancelled by the airline. Please move me to "
        f"{flight.flight} on {moved.isoformat()}."
    }
    parent = durable.snapshot(parent_id)
    assert parent is not None and parent.children == {RunStatus.PENDING: 7}
    page = admin_client.get(
        f"/admin/agentflow/workflowrun/{quote(parent_id)}/change/"
    ).content.decode()
    assert "started <a" in page and "7 runs" in page
    child = kids.first()
    assert child is not None
    child_page = admin_client.get(f"/admin/agentflow/workflowrun/{quote(child.id)}/change/")
    parent_url = reverse("admin:agentflow_workflowrun_change", args=(quote(parent_id),))
    assert f'started by <a href="{parent_url}">' in child_page.content.decode()
    listed = admin_client.get(f"/admin/agentflow/workflowrun/?parent={parent_id}")
    assert listed.status_code == 200 and child.id in listed.content.decode()
