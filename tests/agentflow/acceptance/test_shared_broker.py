"""Two deployments on one broker database (issue 37): each with its own database, workers and
beat, both on the same Redis database and queue. Each takes the other's step messages, finds no
such run and drops them; its runs move only when its own sweeper publishes them again. Nothing
is lost, but before this nothing said why everything was slow.

Now each deployment's worker says so: one WARNING line naming the database the messages came
from and the likely cause (rate-limited: one line however many it drops), and a counter,
`agentflow_stray_step_messages_total{published_by="another_deployment"}`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, connections
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow.models import RunEvent, WorkflowRun
from agentflow.testing.processes import WorkerProcess
from agentflow.testing.waiting import wait_for
from tests.support import workflows
from tests.support.processes import Workers

pytestmark = pytest.mark.django_db(transaction=True)

RUNS = 4
CAUSE = "another deployment most likely consumes the same broker database and queue"


@pytest.fixture
def neighbour() -> Iterator[str]:
    """A second database on the test database's server, migrated: the other deployment's."""
    name = f"{connection.settings_dict['NAME']}_neighbour"
    with _server() as server:
        server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        server.execute(f'CREATE DATABASE "{name}"')
    try:
        with _serving(name):
            call_command("migrate", verbosity=0, interactive=False)
        yield name
    finally:
        connections.close_all()
        with _server() as server:
            server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _server() -> psycopg.Connection[Any]:
    db = connection.settings_dict
    return psycopg.connect(
        host=db["HOST"] or None,
        port=db["PORT"] or None,
        user=db["USER"] or None,
        password=db["PASSWORD"] or None,
        dbname="postgres",
        autocommit=True,
    )


@contextlib.contextmanager
def _serving(name: str) -> Iterator[None]:
    """This process works in the other deployment's database until the block ends."""
    db = connection.settings_dict
    saved = db["NAME"]
    connections.close_all()
    db["NAME"] = name
    try:
        yield
    finally:
        connections.close_all()
        db["NAME"] = saved


def _url(name: str) -> str:
    db = connection.settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{name}"


def _warnings(worker: WorkerProcess) -> list[dict[str, Any]]:
    found = []
    for line in worker.log_path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if isinstance(entry, dict) and CAUSE in str(entry.get("event")):
                found.append(entry)
    return found


def _strays_counted(metrics_dir: Path) -> float:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(metrics_dir))
    return sum(
        sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == "agentflow_stray_step_messages_total"
        and sample.labels == {"published_by": "another_deployment"}
    )


def _all_finished(run_ids: list[str]) -> bool:
    return not WorkflowRun.objects.filter(pk__in=run_ids, status__in=ACTIVE_RUN_STATUSES).exists()


def test_shared_broker__each_deployment_warns_once_naming_the_other_and_counts_them(
    workers: Workers, neighbour: str, tmp_path: Path
) -> None:
    ours_metrics, theirs_metrics = tmp_path / "ours", tmp_path / "theirs"
    ours_metrics.mkdir(), theirs_metrics.mkdir()
    quick = {"AGENTFLOW_LEASE_SECONDS": "2", "AGENTFLOW_SWEEP_INTERVAL": "1"}
    ours = workers.start(beat=True, PROMETHEUS_MULTIPROC_DIR=str(ours_metrics), **quick)
    theirs = workers.start(
        beat=True,
        DATABASE_URL=_url(neighbour),
        PROMETHEUS_MULTIPROC_DIR=str(theirs_metrics),
        **quick,
    )
    our_database = connection.settings_dict["NAME"]

    our_runs = [durable.start(workflows.chain.name) for _ in range(RUNS)]
    told = wait_for(lambda: _warnings(theirs), timeout=60, what="the other deployment to warn")
    with _serving(neighbour):
        for _ in range(RUNS):
            durable.start(workflows.chain.name)
        wait_for(lambda: _warnings(ours), timeout=60, what="this deployment to warn")
    # While both consume, each step goes to the wrong worker half the time and waits a lease for
    # the sweeper (minutes on a loaded machine): the cause told, the other deployment leaves.
    theirs.stop()
    wait_for(lambda: _all_finished(our_runs), timeout=120, what="our runs to finish")

    # Nothing lost: the sweeper moved what the other side dropped.
    runs = WorkflowRun.objects.filter(pk__in=our_runs)
    assert {run.status for run in runs} == {RunStatus.COMPLETED}
    swept = RunEvent.objects.filter(run_id__in=our_runs, kind=RunEvent.Kind.SWEEP_REQUEUE)
    assert swept.exists(), "no step message of ours was taken by the other deployment"

    # Said once by each (rate-limited), with the database the messages came from and why.
    assert len(told) == 1 and len(_warnings(theirs)) == 1
    assert told[0]["level"] == "warning" and told[0]["logger"] == "agentflow.broker"
    assert f"published by database {our_database}@" in told[0]["event"]
    assert f"this database ({neighbour}@" in told[0]["event"]
    assert (
        "Give each deployment a broker database or vhost, or a queue, of its own"
        in (told[0]["event"])
    )
    assert len(_warnings(ours)) == 1
    assert f"published by database {neighbour}@" in _warnings(ours)[0]["event"]

    # Every one counted, said or not.
    assert _strays_counted(theirs_metrics) >= 1
    assert _strays_counted(ours_metrics) >= 1
