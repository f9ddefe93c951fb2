"""What each part of a process does while the database does not answer (issue 37), in this
process, against a database that is really unreachable (tests/support/outage.py): admin pages
answer 503 saying the database is unreachable; `/healthz` names the database, also for the
moment after it is back; `/metrics` reports its gauges as NaN with `agentflow_database_up 0`;
beat's sweeper, the step task and `manage.py sweep` say it once, without a traceback; and the
process says once, at WARNING, that the database answers again.

The same with real gunicorn, workers, beat and a stopped PostgreSQL: tests/refunds/acceptance/
test_database_outage.py.
"""

from __future__ import annotations

import io
import logging
import math
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import ProgrammingError
from django.http import HttpResponse
from django.test import Client, RequestFactory
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agentflow import _store as store
from agentflow import beat, durable
from agentflow._base.states import RunStatus
from agentflow._core import outage
from agentflow._engine.tasks import run_step_task
from agentflow.middleware import DatabaseOutageMiddleware
from agentflow.models import StepCheckpoint, SweeperHeartbeat, WorkflowRun
from tests.support.outage import database_down

pytestmark = pytest.mark.django_db(transaction=True)

ADMIN_PAGES = ("/admin/", "/admin/agentflow/workflowrun/", "/admin/auth/user/")


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[tuple[str, str]]:
    return [(r.name, r.getMessage()) for r in caplog.records if r.levelno == level]


def _tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.exc_info or r.exc_text]


# --- the admin --------------------------------------------------------------------------------
def test_admin__503_says_the_database_is_unreachable_and_logs_it_once(
    admin_client: Client, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A logged-in operator's pages (the session is in the database), and anyone's login."""
    caplog.set_level(logging.INFO)

    with database_down():
        answers = [admin_client.get(path) for path in ADMIN_PAGES * 3]
        login = client.post("/admin/login/", {"username": "admin", "password": "password"})

    for response in [*answers, login]:
        assert response.status_code == 503
        assert response["Retry-After"] == str(outage.RETRY_AFTER_SECONDS)
        page = response.content.decode()
        assert "The database is unreachable" in page
        assert "If you had just sent the form" not in page  # not the customer's 500 page
    errors = _lines(caplog, logging.ERROR)
    assert [name for name, _ in errors] == ["agentflow.outage"]
    assert errors[0][1].startswith("the database is unreachable (OperationalError: connection")
    assert _tracebacks(caplog) == []

    assert admin_client.get("/admin/agentflow/workflowrun/").status_code == 200
    assert [line for line in _lines(caplog, logging.WARNING) if line[0] == "agentflow.outage"]


def test_middleware__an_error_that_is_not_an_outage_is_left_to_django() -> None:
    """A statement the database refused is the code's bug, not an outage: Django's 500, with
    its traceback in the log."""
    refused = ProgrammingError('relation "agentflow_workflowrun" does not exist')
    refused.__cause__ = psycopg.errors.UndefinedTable("does not exist")
    request = RequestFactory().get("/admin/agentflow/workflowrun/")

    assert DatabaseOutageMiddleware(HttpResponse).process_exception(request, refused) is None


# --- /healthz ---------------------------------------------------------------------------------
def test_healthz__names_the_database_while_down_and_while_it_recovers(
    client: Client, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    settings.AGENTFLOW_SWEEP_INTERVAL = 5
    store.heartbeat_record(requeued=0, query_ms=1.0)

    with database_down():
        down = [client.get("/healthz") for _ in range(5)]

    for response in down:
        assert response.status_code == 503
        assert response["Retry-After"] == str(outage.RETRY_AFTER_SECONDS)
        body = response.json()
        assert body["database"] == "error: the database is unreachable (OperationalError)"
        assert body["sweeper"] == "unknown: the database is unreachable"
    assert [name for name, _ in _lines(caplog, logging.ERROR)] == ["agentflow.outage"]

    # Back, with the last sweep from before the outage: beat could not sweep without the
    # database, and has had less than three intervals since.
    SweeperHeartbeat.objects.update(swept_at=timezone.now() - timedelta(seconds=40))
    back = client.get("/healthz")

    assert back.status_code == 503
    body = back.json()
    assert body["database"].startswith("recovering: the database answered again ")
    assert body["sweeper"].startswith("waiting: no sweep for 40 s, as the database was")
    assert "beat" not in body["sweeper"]

    store.heartbeat_record(requeued=0, query_ms=1.0)  # beat's next sweep
    assert client.get("/healthz").json()["status"] == "ok"


# --- /metrics ---------------------------------------------------------------------------------
def _samples(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


GAUGES = (
    "agentflow_runs_active",
    "agentflow_runs_overdue",
    "agentflow_runs_needs_attention",
    "agentflow_runs_waiting_for_approval",
    "agentflow_sweeper_seconds_since_last_sweep",
    "agentflow_runs_by_build",
)


def test_metrics__gauges_are_nan_not_missing_and_database_up_says_why(
    client: Client, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    settings.AGENTFLOW_METRICS_PUBLIC = True
    store.heartbeat_record(requeued=0, query_ms=1.0)
    durable.start("demo", input={"name": "Ana"})  # a build the gauges then list
    read = _samples(client)
    assert read[("agentflow_database_up", ())] == 1

    with database_down():
        scrapes = [_samples(client) for _ in range(3)]

    unknown = scrapes[-1]
    assert unknown[("agentflow_database_up", ())] == 0
    for name in GAUGES:  # every series of the last good scrape is there, as NaN
        before = {key for key in read if key[0] == name}
        assert before, name
        assert {key for key in unknown if key[0] == name} >= before, name
        assert all(math.isnan(unknown[key]) for key in before), name
    assert math.isnan(unknown[("agentflow_sweeper_seconds_since_last_sweep", ())])
    assert [name for name, _ in _lines(caplog, logging.ERROR)] == ["agentflow.outage"]
    assert _lines(caplog, logging.WARNING) == []  # not a warning per scrape either

    assert _samples(client)[("agentflow_database_up", ())] == 1


def test_metrics__a_process_that_never_read_them_still_lists_what_it_can_name(
    client: Client, settings: Any
) -> None:
    settings.AGENTFLOW_METRICS_PUBLIC = True
    with database_down():
        unknown = _samples(client)

    assert unknown[("agentflow_database_up", ())] == 0
    assert math.isnan(unknown[("agentflow_sweeper_seconds_since_last_sweep", ())])
    demo = ("agentflow_runs_active", (("status", "RUNNING"), ("workflow", "demo")))
    assert math.isnan(unknown[demo])


# --- beat, the step task, the sweep command ---------------------------------------------------
class _Beat(beat.SweeperMixin):
    app = None


def test_beat__a_sweep_without_the_database_is_told_once_not_each_tick(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    scheduler = _Beat()

    with database_down():
        for _ in range(10):
            scheduler._sweep(1.0)

    assert [name for name, _ in _lines(caplog, logging.ERROR)] == ["agentflow.outage"]
    assert "while sweeping" in _lines(caplog, logging.ERROR)[0][1]
    assert _tracebacks(caplog) == []

    scheduler._sweep(1.0)

    assert SweeperHeartbeat.objects.exists()
    said = [line for name, line in _lines(caplog, logging.WARNING) if name == "agentflow.outage"]
    assert len(said) == 1 and said[0].startswith("the database answers again")


@pytest.mark.usefixtures("engine")
def test_step_task__acked_without_a_traceback_and_the_run_kept_for_the_sweeper(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run_id = durable.start("demo", input={"name": "Ana"})

    with database_down():
        results = [run_step_task.apply(args=[run_id, 1]) for _ in range(3)]

    assert all(result.successful() for result in results)  # acked, as a failure would be
    assert [name for name, _ in _lines(caplog, logging.ERROR)] == ["agentflow.outage"]
    assert "while running steps" in _lines(caplog, logging.ERROR)[0][1]
    assert _tracebacks(caplog) == []
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.current_seq == 1 and run.status in (RunStatus.PENDING, RunStatus.RUNNING)
    assert not StepCheckpoint.objects.filter(run_id=run_id).exists()

    run_step_task.apply(args=[run_id, 1])  # the sweeper's message, once it is back

    assert StepCheckpoint.objects.filter(run_id=run_id, seq=1).exists()


def test_sweep_command__one_line_and_a_non_zero_exit() -> None:
    with database_down(), pytest.raises(CommandError) as refused:
        call_command("sweep", stdout=io.StringIO(), stderr=io.StringIO())

    assert str(refused.value).startswith("the database is unreachable (OperationalError: ")
    assert str(refused.value).endswith("; nothing was swept")
    assert "\n" not in str(refused.value)
