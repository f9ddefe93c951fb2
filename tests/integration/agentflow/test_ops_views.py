"""/healthz and /metrics: what an orchestrator and Prometheus scrape."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agentflow.models import WorkflowRun
from agentflow.states import RunStatus

pytestmark = pytest.mark.django_db


def _run(status: str, *, wake_in_seconds: float | None) -> None:
    wake_at = (
        None if wake_in_seconds is None else timezone.now() + timedelta(seconds=wake_in_seconds)
    )
    WorkflowRun.objects.create(workflow="demo", version=1, status=status, wake_at=wake_at)


def test_healthz__reports_database_and_broker(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "broker": "ok"}


def test_metrics__counts_runs_by_status_and_the_sweepers_backlog(client: Client) -> None:
    _run(RunStatus.RUNNING, wake_in_seconds=30)
    _run(RunStatus.RUNNING, wake_in_seconds=-5)  # overdue: the sweeper's backlog
    _run(RunStatus.NEEDS_ATTENTION, wake_in_seconds=None)
    _run(RunStatus.COMPLETED, wake_in_seconds=None)

    response = client.get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    lines = set(response.content.decode().splitlines())
    assert 'agentflow_runs{status="RUNNING"} 2' in lines
    assert 'agentflow_runs{status="NEEDS_ATTENTION"} 1' in lines
    assert 'agentflow_runs{status="COMPLETED"} 1' in lines
    assert 'agentflow_runs{status="FAILED"} 0' in lines
    assert "agentflow_runs_overdue 1" in lines


def test_root__sends_a_visitor_to_the_refund_form(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/refunds/new/"
