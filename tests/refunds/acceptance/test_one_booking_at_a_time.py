"""Two requests for one booking, different words, sent together (issue 40): refund runs carry the
booking as their concurrency key with a cap of 1, so the second waits while the first runs,
starts once it ended, finds the seat the first changed, and says so to the customer. Real
workers, the real sandbox, counted at its ledger; the order read from the runs' own events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from agentflow import durable
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.testing.processes import WorkerProcess
from refunds import priorities, services, wording
from refunds.models import RefundRequest
from refunds.sandbox.airline import owner_of
from tests.support.airline_days import new_flight
from tests.support.refunds import finished, partner_effects, refund_worker_env, step
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def worker(clean_sandbox: SandboxProcess, transactional_db: None) -> Iterator[WorkerProcess]:
    """Two pool processes: room for both runs at once, were they allowed."""
    started = WorkerProcess(concurrency=2, env=refund_worker_env(clean_sandbox), beat=True)
    try:
        yield started.start(timeout=60)
    finally:
        started.kill()


def send(reference: str, words: str, token: str) -> str:
    owner = owner_of(reference)
    request = services.refund_request_create(
        email=owner.email,
        booking_reference=reference,
        last_name=owner.last_name,
        message=words,
        submission_token=token,
        client_ip="127.0.0.1",
    )
    assert request.workflow_id is not None
    return request.workflow_id


def customer_view(run_id: str) -> dict[str, Any]:
    refund = RefundRequest.objects.get(workflow_id=run_id)
    return Client().get(f"/refunds/{refund.public_id}/status.json").json()["customer"]


def test_two_requests_for_one_booking__one_after_the_other__second_says_the_seat_changed(
    clean_sandbox: SandboxProcess, worker: WorkerProcess
) -> None:
    reference = "TWO001"
    first_flight, second_flight = new_flight("SK1240"), new_flight("SK1240", weeks_ahead=16)
    first = send(reference, first_flight.words("Please move me to {flight} on {date}."), "t-1")
    second = send(reference, second_flight.words("Hi! Can I fly {flight} on {date}?"), "t-2")
    waiting = durable.snapshot(second)
    assert waiting is not None and waiting.status == durable.RunStatus.WAITING
    assert "same concurrency key" in waiting.held
    assert waiting.steps == []

    done_first = finished(first, worker, timeout=90)
    done_second = finished(second, worker, timeout=90)

    assert done_first.status == durable.RunStatus.COMPLETED, done_first.error
    assert done_second.status == durable.RunStatus.FAILED
    # One after the other: the second was admitted only once the first had ended (the
    # database's clock on both), and its first step ran after that.
    ended = WorkflowRun.objects.get(pk=first).updated_at
    admitted = RunEvent.objects.get(run_id=second, kind=RunEvent.Kind.RELEASED).at
    began = StepCheckpoint.objects.filter(run_id=second).order_by("seq").first()
    assert began is not None and ended <= admitted <= began.started_at
    assert step(done_second, "fetch_booking").status == durable.StepStatus.COMPLETED
    assert step(done_second, "check_cancellation_policy").status == durable.StepStatus.FAILED
    # Nothing of the booking or the card was touched by the second.
    ledger = partner_effects(clean_sandbox, second)
    assert all(ledger[kind] == [] for kind in ("authorizations", "seat_cancellations"))
    assert len(partner_effects(clean_sandbox, first)["boarding_passes"]) == 1
    # The customer reads where the first request put them.
    issued = step(done_first, "issue_boarding_pass").output
    told = wording.ALREADY_CHANGED_TO.say(
        flight=issued["flight"], date=wording.date_in_words(issued["date"]), seat=issued["seat"]
    )
    assert told and done_second.error.endswith(told), done_second.error
    view = customer_view(second)
    assert view["outcome"] == "failed"
    assert view["message"].startswith(told), view["message"]
    assert wording.is_customer_text(view["message"])
    assert (
        priorities.booking_of(
            {"refund_id": RefundRequest.objects.get(workflow_id=second).public_id}
        )
        == reference
    )
