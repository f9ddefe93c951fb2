"""Step messages stamped with the database their run lives in, and what a worker says of one
for a run its database does not know (issue 37): in this process, through the step task as a
worker runs it. Two real deployments on one Redis database: tests/agentflow/acceptance/
test_shared_broker.py.
"""

from __future__ import annotations

import json
import logging

import pytest
from django.db import connection

from agentflow import durable
from agentflow._core import origin
from agentflow._engine.tasks import run_step_task
from agentflow._observe import metrics, telemetry
from tests.support.processes import RedisServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


@pytest.fixture(autouse=True)
def _nothing_told_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rate limit is per process: each test starts as a process that said nothing yet,
    and has not failed to read its database's name (a test without database access did)."""
    monkeypatch.setattr(telemetry, "_strays", telemetry._Strays())
    monkeypatch.setattr(origin, "_failed_at", {})


def _counted(published_by: str) -> float:
    return float(metrics.STRAY_STEP_MESSAGES.labels(published_by)._value.get())


def _said(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


def test_step_message__carries_the_database_its_run_lives_in(engine: RedisServer) -> None:
    durable.start("demo", input={"name": "Ana"})

    (raw,) = engine.queued_messages()
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_database(), system_identifier FROM pg_control_system()")
        name, system = cursor.fetchone()
    assert json.loads(raw)["headers"][origin.HEADER] == f"{name}@{system}"


def test_unknown_run__from_another_deployment_is_counted_and_told_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    before = _counted("another_deployment")

    for n in range(3):
        run_step_task.apply(args=[f"wf_theirs{n}", 1], headers={origin.HEADER: "shop@42"})

    assert _counted("another_deployment") == before + 3
    (told,) = _said(caplog, "agentflow.broker")
    assert told.startswith(
        f"1 step message for runs this database ({origin.database()}) does not know reached "
        "this worker (run wf_theirs0; published by database shop@42): another deployment most "
        "likely consumes the same broker database and queue ('celery')."
    )
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == "agentflow.broker")


def test_unknown_run__unstamped_is_counted_as_such(caplog: pytest.LogCaptureFixture) -> None:
    before = _counted("unstamped")

    run_step_task.apply(args=["wf_old_publisher", 1])

    assert _counted("unstamped") == before + 1
    (told,) = _said(caplog, "agentflow.broker")
    assert "published by an unstamped publisher" in told


def test_unknown_run__stamped_by_this_database_was_deleted_here(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Retention (or a delete) took the run after its message went out: not a neighbour."""
    before = _counted("another_deployment") + _counted("unstamped")

    run_step_task.apply(args=["wf_deleted", 1], headers={origin.HEADER: origin.database()})

    assert _counted("another_deployment") + _counted("unstamped") == before
    assert _said(caplog, "agentflow.broker") == []
    assert "run wf_deleted does not exist; dropping its message" in _said(caplog, "agentflow.steps")
