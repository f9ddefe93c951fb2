"""The status page of a refund whose run retention deleted: closed, final, never a 500."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agentflow import _store as store
from agentflow._base.states import RunStatus
from agentflow.models import WorkflowRun
from refunds.models import RefundRequest

pytestmark = pytest.mark.django_db


@pytest.fixture
def purged_refund() -> RefundRequest:
    run = WorkflowRun.objects.create(workflow="refund", version=1, status=RunStatus.COMPLETED)
    long_ago = timezone.now() - timedelta(days=40)
    WorkflowRun.objects.filter(pk=run.pk).update(created_at=long_ago, updated_at=long_ago)
    refund = RefundRequest.objects.create(
        email="ana.lopez@example.com",
        booking_reference="ABC123",
        message="Please move me to the 18:05 flight.",
        submission_token="t" * 32,
        workflow_id=run.id,
    )
    assert store.runs_purge(older_than=timedelta(days=30)).runs == 1
    return refund


def test_status_page__purged_run_shows_the_request_closed_and_stops_polling(
    client: Client, purged_refund: RefundRequest
) -> None:
    page = client.get(f"/refunds/{purged_refund.public_id}/")

    assert page.status_code == 200
    text = page.content.decode()
    assert "This request is closed" in text
    assert 'data-final="true"' in text
    assert "progress--archived" in text


def test_status_json__purged_run_has_null_status_and_a_final_archived_outcome(
    client: Client, purged_refund: RefundRequest
) -> None:
    body = client.get(f"/refunds/{purged_refund.public_id}/status.json").json()

    assert body["status"] is None
    assert body["workflow_id"] == purged_refund.workflow_id
    assert body["steps"] == []
    assert body["customer"]["outcome"] == "archived"
    assert body["customer"]["final"] is True
