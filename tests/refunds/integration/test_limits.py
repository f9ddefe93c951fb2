"""The per-booking and per-e-mail limits count strangers, not the booking's owner: a reference
is printed on every bag tag, so wrong guesses must not lock its owner out (issue 15, finding 6).
Through the real form, with runs played in this process against the partner sandbox."""

from __future__ import annotations

import html
import itertools
import re
from collections.abc import Callable

import pytest
from django.test import Client, override_settings

from agentflow._base.states import RunStatus
from agentflow.models import WorkflowRun
from refunds.models import RefundRequest
from refunds.ownership import MISMATCH
from refunds.sandbox.airline import owner_of
from tests.support.airline_days import new_flight
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

REFERENCE = "LIM001"
OWNER = owner_of(REFERENCE)
_sent = itertools.count(1)


def send(client: Client, *, ip: str, **fields: str):
    """One customer's form: a fresh token, then the POST from their address."""
    page = client.get("/refunds/new/").content.decode()
    [token] = re.findall(r'name="submission_token" value="([^"]+)"', page)
    data = {
        "booking_reference": REFERENCE,
        "last_name": OWNER.last_name,
        "email": OWNER.email,
        "message": f"{new_flight().words()} ({next(_sent)})",
        "submission_token": html.unescape(token),
        **fields,
    }
    return client.post("/refunds/new/", data, REMOTE_ADDR=ip)


def run_of(response) -> str:
    assert response.status_code == 303, response.content.decode()[:500]
    public_id = response["Location"].split("/")[2]
    return RefundRequest.objects.get(public_id=public_id).workflow_id


@override_settings(REFUNDS_SUBMIT_LIMIT=5, REFUNDS_BOOKING_LIMIT=3)
def test_six_strangers_then_the_owner__the_owner_is_accepted_and_the_refund_completes(
    client: Client, drive: Callable[[str], WorkflowRun], partners: SandboxProcess
) -> None:
    answers = [
        send(client, ip=f"198.51.100.{n}", last_name=f"Guess{n}", email=f"guess{n}@example.com")
        for n in range(6)
    ]

    assert [answer.status_code for answer in answers] == [303] * 3 + [429] * 3
    for answer in answers[:3]:
        failed = drive(run_of(answer))
        assert (failed.status, failed.error) == (RunStatus.FAILED, f"fetch_booking: {MISMATCH}")
    assert send(client, ip="198.51.100.9", last_name="Guess9").status_code == 429

    owners = drive(run_of(send(client, ip="192.0.2.7")))

    assert owners.status == RunStatus.COMPLETED, owners.error
    ledger = partners.ledger(workflow_id=owners.id)
    assert [payment["amount"] for payment in ledger["payments"]] == [4500]
    assert len(ledger["boarding_passes"]) == 1


@override_settings(REFUNDS_SUBMIT_LIMIT=5, REFUNDS_BOOKING_LIMIT=0)
def test_strangers_using_the_owners_email__do_not_lock_the_owner_out(
    client: Client, partners: SandboxProcess
) -> None:
    for n in range(5):
        assert send(client, ip=f"198.51.100.{n}", last_name=f"Guess{n}").status_code == 303

    assert send(client, ip="198.51.100.8", last_name="Guess8").status_code == 429
    assert send(client, ip="192.0.2.7").status_code == 303  # the owner


@override_settings(REFUNDS_SUBMIT_LIMIT=0, REFUNDS_BOOKING_LIMIT=1, REFUNDS_OWNER_LIMIT=2)
def test_a_verified_owner_has_a_limit_of_their_own(
    client: Client, drive: Callable[[str], WorkflowRun], partners: SandboxProcess
) -> None:
    # Verified requests do not count toward the strangers' limit of one. The second, for the
    # booking the first changed, ends before any effect saying so (issue 40), still verified.
    first, second = (drive(run_of(send(client, ip="192.0.2.7"))) for _ in range(2))
    assert first.status == RunStatus.COMPLETED
    assert second.status == RunStatus.FAILED
    assert "already changed by your earlier request" in second.error

    refused = send(client, ip="192.0.2.7")

    assert refused.status_code == 429
    assert "several requests for this booking today" in refused.content.decode()
