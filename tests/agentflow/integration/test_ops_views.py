"""/healthz and /metrics in-process, on the real Postgres and Redis: the sweeper's threshold, the
gauges read from the database, the bearer token, and counters that move only after commit.

The same endpoints against real gunicorn, worker and beat processes: tests/config/acceptance/
test_operations.py.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.core import checks
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus, WaitKind
from agentflow._observe import metrics
from agentflow.models import RunEvent, RunWait, SweeperHeartbeat, WorkflowRun
from refunds.gateways import AirlineGateway, BookingNotFound, CrmGateway
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(autouse=True)
def metrics_public(settings: Any) -> None:
    """Scraped as over a private network unless a test says otherwise (DEBUG is off here)."""
    settings.AGENTFLOW_METRICS_PUBLIC = True


def _run(status: str, *, wake_in_seconds: float | None, workflow: str = "demo") -> WorkflowRun:
    wake_at = (
        None if wake_in_seconds is None else timezone.now() + timedelta(seconds=wake_in_seconds)
    )
    return WorkflowRun.objects.create(workflow=workflow, version=1, status=status, wake_at=wake_at)


def scrape(client: Client, **headers: str) -> Samples:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.content[:300]
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def swept_seconds_ago(seconds: float) -> None:
    store.heartbeat_record(requeued=0, query_ms=1.0)
    SweeperHeartbeat.objects.update(swept_at=timezone.now() - timedelta(seconds=seconds))


# --- /healthz ---------------------------------------------------------------------------------
def test_healthz__ok_with_a_recent_sweep(client: Client) -> None:
    store.heartbeat_record(requeued=0, query_ms=1.0)

    response = client.get("/healthz")

    assert response.status_code == 200
    body = response.json()
    assert {key: body[key] for key in ("status", "database", "broker", "sweeper")} == {
        "status": "ok",
        "database": "ok",
        "broker": "ok",
        "sweeper": "ok",
    }
    assert body["sweeper_age_seconds"] >= 0  # and inside the limit, or the status says error


def test_healthz__still_ok_inside_three_sweep_intervals(client: Client, settings: Any) -> None:
    settings.AGENTFLOW_SWEEP_INTERVAL = 5
    swept_seconds_ago(14)

    assert client.get("/healthz").status_code == 200


def test_healthz__503_naming_the_sweeper_after_three_intervals_without_a_sweep(
    client: Client, settings: Any
) -> None:
    settings.AGENTFLOW_SWEEP_INTERVAL = 5
    swept_seconds_ago(20)

    response = client.get("/healthz")

    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "error" and body["database"] == "ok"
    # The age is the database's (its transaction's now(), which may be a little before this
    # test's clock read): about 20 s, past the 15 s limit; the message names the age reported.
    age = body["sweeper_age_seconds"]
    assert 15 < age < 60
    expected = f"error: no sweep for {age:.0f} s (limit 15 s; is celery beat running?)"
    assert body["sweeper"] == expected


def test_healthz__503_when_the_sweeper_never_ran(client: Client) -> None:
    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["sweeper"] == "error: the sweeper never ran (is celery beat running?)"


# --- /metrics: gauges from Postgres -------------------------------------------------------------
def test_metrics__gauges_count_active_overdue_and_parked_runs_by_workflow(client: Client) -> None:
    _run(RunStatus.RUNNING, wake_in_seconds=30)
    _run(RunStatus.RUNNING, wake_in_seconds=-5)  # overdue: the sweeper's backlog
    _run(RunStatus.WAITING, wake_in_seconds=-1, workflow="refund")
    _run(RunStatus.NEEDS_ATTENTION, wake_in_seconds=None)
    _run(RunStatus.COMPLETED, wake_in_seconds=None)
    before = time.monotonic()
    swept_seconds_ago(2)

    samples = scrape(client)
    waited = time.monotonic() - before

    assert value(samples, "agentflow_runs_active", workflow="demo", status="RUNNING") == 2
    assert value(samples, "agentflow_runs_active", workflow="refund", status="WAITING") == 1
    assert ("agentflow_runs_active", (("status", "PENDING"), ("workflow", "refund"))) in samples
    assert value(samples, "agentflow_runs_overdue", workflow="demo") == 1
    assert value(samples, "agentflow_runs_overdue", workflow="refund") == 1
    assert value(samples, "agentflow_runs_needs_attention", workflow="demo") == 1
    assert value(samples, "agentflow_runs_needs_attention", workflow="refund") == 0
    # now() is the transaction's start here, a moment before the row was back-dated.
    # The age grows by however long this took on a busy machine, no more.
    assert 1.5 <= value(samples, "agentflow_sweeper_seconds_since_last_sweep") <= 2 + waited


def test_metrics__scrape_reads_only_active_and_parked_runs_through_their_partial_indexes(
    client: Client,
) -> None:
    with CaptureQueriesContext(connection) as queries:
        scrape(client)
    statements = [q["sql"] for q in queries.captured_queries]  # (the heartbeat's is raw psycopg)
    runs = [sql for sql in statements if "agentflow_workflowrun" in sql and "runwait" not in sql]
    assert len(runs) == 2 and all('"status" IN' in sql or '"status" =' in sql for sql in runs)
    waits = [sql for sql in statements if "agentflow_runwait" in sql]
    assert len(waits) == 1 and '"resolved_at" IS NULL' in waits[0]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # tiny table: make the choice visible
        plans = []
        for sql in runs:
            cursor.execute(f"EXPLAIN {sql}")
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
        cursor.execute(f"EXPLAIN {waits[0]}")
        waits_plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "run_sweep_due" in plans[0], plans[0]
    assert "run_needs_attention" in plans[1], plans[1]
    assert "wait_open" in waits_plan, waits_plan


def test_metrics__gauge_counts_runs_waiting_for_approval_by_workflow(client: Client) -> None:
    waiting = _run(RunStatus.WAITING, wake_in_seconds=3600)
    RunWait.objects.create(
        run=waiting,
        branch=0,
        seq=1,
        kind=WaitKind.APPROVAL,
        name="charge",
        requested_at=timezone.now(),
        deadline=waiting.wake_at,
    )
    decided = _run(RunStatus.RUNNING, wake_in_seconds=30)
    RunWait.objects.create(
        run=decided,
        branch=0,
        seq=1,
        kind=WaitKind.APPROVAL,
        name="charge",
        requested_at=timezone.now(),
        resolved_at=timezone.now(),
        outcome={"approved": True},
    )

    samples = scrape(client)

    assert value(samples, "agentflow_runs_waiting_for_approval", workflow="demo") == 1


def test_metrics__bearer_token_required_when_configured(client: Client, settings: Any) -> None:
    settings.AGENTFLOW_METRICS_TOKEN = "t0ken"

    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Basic t0ken"}).status_code == 401
    assert scrape(client, Authorization="Bearer t0ken")


def test_metrics__debug_off_without_a_token_or_public_is_not_served(
    client: Client, settings: Any
) -> None:
    settings.AGENTFLOW_METRICS_PUBLIC = False

    assert client.get("/metrics").status_code == 404
    assert client.get("/metrics", headers={"Authorization": "Bearer anything"}).status_code == 404
    settings.DEBUG = True
    assert scrape(client)  # a developer's machine
    settings.DEBUG, settings.AGENTFLOW_METRICS_TOKEN = False, "t0ken"
    assert client.get("/metrics").status_code == 401
    assert scrape(client, Authorization="Bearer t0ken")


@pytest.mark.parametrize(
    ("debug", "token", "public", "warned"),
    [
        (False, "", False, True),
        (False, "t0ken", False, False),
        (False, "", True, False),
        (True, "", False, False),
    ],
)
def test_system_check__warns_when_metrics_are_closed_to_every_scraper(
    settings: Any, debug: bool, token: str, public: bool, warned: bool
) -> None:
    settings.DEBUG, settings.AGENTFLOW_METRICS_TOKEN = debug, token
    settings.AGENTFLOW_METRICS_PUBLIC = public

    found = [m.id for m in checks.run_checks(tags=[checks.Tags.security])]

    assert ("agentflow.W001" in found) is warned


# --- /metrics: counters from every process's files ---------------------------------------------
@pytest.mark.django_db(transaction=True)
def test_metrics__events_count_only_once_their_transaction_commits(client: Client) -> None:
    run = _run(RunStatus.RUNNING, wake_in_seconds=30)
    before = value(scrape(client), "agentflow_run_events_total", kind="sweep_requeue")

    with transaction.atomic():
        store.event_add(run.id, RunEvent.Kind.SWEEP_REQUEUE, "rolled back", actor="sweeper")
        transaction.set_rollback(True)
    assert value(scrape(client), "agentflow_run_events_total", kind="sweep_requeue") == before

    store.event_add(run.id, RunEvent.Kind.SWEEP_REQUEUE, "kept", actor="sweeper")
    assert value(scrape(client), "agentflow_run_events_total", kind="sweep_requeue") == before + 1


@pytest.mark.django_db(transaction=True)
def test_metrics__runs_started_and_cancelled_are_counted_by_workflow(client: Client) -> None:
    before = scrape(client)
    run_id = durable.start("demo", input={"name": "metrics"})
    durable.cancel(run_id, actor="ops", reason="test")

    after = scrape(client)
    for name, labels in (
        ("agentflow_runs_started_total", {"workflow": "demo"}),
        ("agentflow_runs_finished_total", {"workflow": "demo", "status": "CANCELLED"}),
        ("agentflow_run_events_total", {"kind": "operator_cancel"}),
    ):
        assert value(after, name, **labels) == value(before, name, **labels) + 1, name


def test_model_tokens__spent_and_saved_move_their_counters(client: Client) -> None:
    labels = {"workflow": "refund", "model": "scripted"}
    before = scrape(client)

    metrics.model_tokens(workflow="refund", model="scripted", spent=120, saved=0)
    metrics.model_tokens(workflow="refund", model="scripted", spent=0, saved=95)

    after = scrape(client)
    spent, saved = "agentflow_model_tokens_spent_total", "agentflow_model_tokens_saved_total"
    assert value(after, spent, **labels) == value(before, spent, **labels) + 120
    assert value(after, saved, **labels) == value(before, saved, **labels) + 95
    with pytest.raises(ValueError, match="negative"):
        metrics.model_tokens(workflow="refund", model="scripted", spent=-1)


def test_partner_errors__counted_by_partner_and_kind(
    client: Client, clean_sandbox: SandboxProcess
) -> None:
    clean_sandbox.set_fault(endpoint="crm.update", error_rate=1.0, error_status=503, count=1)
    labels = {"partner": "crm", "kind": "retryable"}
    before = value(scrape(client), "agentflow_partner_errors_total", **labels)

    with pytest.raises(durable.RetryableStepError):
        CrmGateway(clean_sandbox.url).update(
            customer_email="a@example.com", reference="ABC123", note="n", key="k1", workflow_id="wf"
        )

    assert value(scrape(client), "agentflow_partner_errors_total", **labels) == before + 1


def test_partner_errors__an_unknown_booking_is_an_answer_not_an_error(
    client: Client, clean_sandbox: SandboxProcess
) -> None:
    """Otherwise the permanent count would move only for references that do not exist."""
    clean_sandbox.set_fault(unknown_bookings=["NOSUCH"])
    labels = {"partner": "airline", "kind": "permanent"}
    before = value(scrape(client), "agentflow_partner_errors_total", **labels)
    airline = AirlineGateway(clean_sandbox.url)

    with pytest.raises(BookingNotFound):
        airline.booking("NOSUCH")
    airline.booking("ABC123")

    assert value(scrape(client), "agentflow_partner_errors_total", **labels) == before


def test_root__sends_a_visitor_to_the_refund_form(client: Client) -> None:
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"] == "/refunds/new/"
