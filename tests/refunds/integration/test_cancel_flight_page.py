"""The console's "Cancel a flight" page (issue 40): an operator allowed to makes the sandbox
airline cancel a flight and send its signed notice, exactly as `manage.py sandbox cancel-flight`
does; bad input gets field errors and cancels nothing; anyone else gets 403 and no button."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from agentflow.models import WorkflowRun
from tests.support.airline_days import new_flight
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

PAGE = "/admin/refunds/refundrequest/cancel-flight/"
LIST = "/admin/refunds/refundrequest/"


@pytest.fixture
def service(live_server: Any, settings: Any, partners: SandboxProcess) -> SandboxProcess:
    """The refund service taking the airline's notices at its live server."""
    settings.REFUNDS_AIRLINE_SECRET = "whsec_airline_page"
    settings.REFUNDS_AIRLINE_NOTICES_URL = f"{live_server.url}/refunds/airline/notices/"
    return partners


def staff(*permissions: str) -> Client:
    user = User.objects.create_user("op", password="x", is_staff=True)
    for codename in permissions:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.usefixtures("service")
def test_cancel_flight__operator_allowed__sandbox_cancels_and_the_notice_starts_a_run() -> None:
    client = staff("view_refundrequest", "cancel_flight")
    assert PAGE in client.get(LIST).content.decode()  # the button
    flight = new_flight("SK1236", weeks_ahead=6)

    answer = client.post(PAGE, {"flight": flight.flight, "date": flight.date, "passengers": 3})

    assert answer.status_code == 302 and answer["Location"] == LIST
    told = client.get(LIST).content.decode()
    assert f"{flight.flight} on {flight.date} cancelled: 3 passengers moved to" in told
    run = WorkflowRun.objects.get(workflow="flight_cancelled")
    assert (run.input["flight"], run.input["date"]) == (flight.flight, flight.date)


@pytest.mark.usefixtures("service")
def test_cancel_flight__bad_input__field_errors_and_nothing_cancelled() -> None:
    client = staff("view_refundrequest", "cancel_flight")

    day = new_flight("SK1236", weeks_ahead=6).day.strftime("%d/%m/%Y")  # not YYYY-MM-DD
    answer = client.post(PAGE, {"flight": "sk 12", "date": day, "passengers": "0"})

    page = answer.content.decode()
    assert answer.status_code == 200
    assert "A flight is two capital letters and 1-4 digits" in page
    assert "Enter a valid date." in page
    assert "Ensure this value is greater than or equal to 1." in page
    assert not WorkflowRun.objects.exists()


def test_cancel_flight__sandbox_unreachable__says_so_on_the_page(settings: Any) -> None:
    settings.REFUNDS_AIRLINE_SECRET = "whsec_airline_page"
    settings.SANDBOX_URL = "http://127.0.0.1:9"  # nothing listens on the discard port
    client = staff("view_refundrequest", "cancel_flight")

    flight = new_flight("SK1236", weeks_ahead=6)
    answer = client.post(PAGE, {"flight": flight.flight, "date": flight.date, "passengers": 3})

    assert answer.status_code == 200
    assert "did not answer" in answer.content.decode()


def test_cancel_flight__without_the_permission__403_and_no_button() -> None:
    client = staff("view_refundrequest")

    assert PAGE not in client.get(LIST).content.decode()
    assert client.get(PAGE).status_code == 403
    flight = new_flight("SK1236", weeks_ahead=6)
    assert client.post(PAGE, {"flight": flight.flight, "date": flight.date}).status_code == 403
    assert not WorkflowRun.objects.exists()
