"""Retention (docs/protocol.md, "Retention") against real Postgres: which runs go, in which
transactions, and how the command and the beat task are driven."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import connection, connections, transaction
from django.test import override_settings
from django.utils import timezone

from agentflow import _store as store
from agentflow import beat, durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus, StepStatus
from agentflow._engine import tasks
from agentflow.models import (
    RunEvent,
    StepCheckpoint,
    SupersededStep,
    SweeperHeartbeat,
    WorkflowRun,
)

pytestmark = pytest.mark.django_db(transaction=True)

OLD = timedelta(days=40)
NEW = timedelta(hours=1)
RETENTION = timedelta(days=30)


def make_runs(
    count: int,
    status: str,
    *,
    created_ago: timedelta,
    updated_ago: timedelta | None = None,
    steps: int = 2,
    events: int = 1,
    workflow: str = "retention",
) -> list[str]:
    """`count` runs with `steps` checkpoints and `events` events each, dated in the past."""
    now = timezone.now()
    active = status in ACTIVE_RUN_STATUSES
    runs = WorkflowRun.objects.bulk_create(
        WorkflowRun(
            workflow=workflow,
            version=1,
            status=status,
            current_seq=steps + 1,
            wake_at=now + timedelta(seconds=30) if active else None,
        )
        for _ in range(count)
    )
    ids = [run.id for run in runs]
    StepCheckpoint.objects.bulk_create(
        StepCheckpoint(
            run_id=run_id,
            seq=seq,
            name=f"step_{seq}",
            kind="read",
            status=StepStatus.COMPLETED,
            idempotency_key=f"{run_id}_step_{seq}",
            first_started_at=now,
            started_at=now,
            finished_at=now,
        )
        for run_id in ids
        for seq in range(1, steps + 1)
    )
    RunEvent.objects.bulk_create(
        RunEvent(run_id=run_id, kind=RunEvent.Kind.SWEEP_REQUEUE, detail="test")
        for run_id in ids
        for _ in range(events)
    )
    # auto_now and auto_now_add fields are set on save; dating them back needs an update.
    WorkflowRun.objects.filter(id__in=ids).update(
        created_at=now - created_ago, updated_at=now - (updated_ago or created_ago)
    )
    return ids


def supersede(run_id: str) -> int:
    """A checkpoint an operator's fork set aside, kept as history of the run."""
    now = timezone.now()
    return SupersededStep.objects.create(
        run_id=run_id,
        branch=0,
        seq=1,
        name="step_1",
        kind="read",
        status=StepStatus.COMPLETED,
        attempts=1,
        idempotency_key=f"{run_id}_step_1",
        superseded_at=now,
    ).pk


def nonzero(counts: dict[str, int]) -> dict[str, int]:
    return {table: n for table, n in counts.items() if n}


def rows_of(ids: list[str]) -> tuple[int, int, int]:
    return (
        WorkflowRun.objects.filter(id__in=ids).count(),
        StepCheckpoint.objects.filter(run_id__in=ids).count(),
        RunEvent.objects.filter(run_id__in=ids).count(),
    )


def test_purge__deletes_old_finished_runs_with_their_rows_and_nothing_else() -> None:
    old_finished = [
        *make_runs(2, RunStatus.COMPLETED, created_ago=OLD),
        *make_runs(2, RunStatus.FAILED, created_ago=OLD, steps=3, events=2),
        *make_runs(1, RunStatus.CANCELLED, created_ago=OLD),
    ]
    kept = {
        "active": [
            *make_runs(1, RunStatus.PENDING, created_ago=OLD),
            *make_runs(1, RunStatus.RUNNING, created_ago=OLD),
            *make_runs(1, RunStatus.WAITING, created_ago=OLD),
        ],
        "parked": make_runs(1, RunStatus.NEEDS_ATTENTION, created_ago=OLD),
        "recent": make_runs(2, RunStatus.COMPLETED, created_ago=NEW),
        # Started long ago, finished yesterday (a long back-off, an operator retry): it is
        # kept until it has been finished for the whole retention period.
        "recently_changed": make_runs(1, RunStatus.COMPLETED, created_ago=OLD, updated_ago=NEW),
    }

    # Any engine table that points at runs goes with them: here a forked run's set-aside step.
    set_aside = [supersede(old_finished[0]), supersede(kept["parked"][0])]

    deleted = store.runs_purge(older_than=RETENTION)

    assert rows_of(old_finished) == (0, 0, 0)
    assert deleted.runs == 5
    assert nonzero(deleted.children) == {
        StepCheckpoint._meta.db_table: 2 * 2 + 2 * 3 + 1 * 2,
        RunEvent._meta.db_table: 2 * 1 + 2 * 2 + 1 * 1,
        SupersededStep._meta.db_table: 1,
    }
    assert deleted.rows == 5 + 12 + 7 + 1
    assert list(SupersededStep.objects.values_list("pk", flat=True)) == [set_aside[1]]
    assert deleted.batches == [5]
    for why, ids in kept.items():
        assert rows_of(ids) == (len(ids), 2 * len(ids), len(ids)), why


def test_purge__batches_are_at_most_1000_runs_each_in_its_own_transaction() -> None:
    ids = make_runs(2500, RunStatus.COMPLETED, created_ago=OLD, steps=1, events=1)
    seen: dict[int, dict[str, int]] = defaultdict(dict)

    def record(execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict):
        """Each DELETE's row count, filed under the Postgres transaction that ran it."""
        result = execute(sql, params, many, context)
        if sql.startswith("DELETE FROM"):
            table = sql.split()[2]
            deleted = context["cursor"].rowcount
            with connection.cursor() as cursor:  # another cursor: leave the rowcount alone
                cursor.execute("SELECT txid_current()")
                seen[cursor.fetchone()[0]][table] = deleted
        return result

    with connection.execute_wrapper(record):
        deleted = store.runs_purge(older_than=RETENTION)

    runs, steps, events = (
        WorkflowRun._meta.db_table,
        StepCheckpoint._meta.db_table,
        RunEvent._meta.db_table,
    )
    per_transaction = [nonzero(seen[txid]) for txid in sorted(seen)]
    assert per_transaction == [
        {steps: 1000, events: 1000, runs: 1000},
        {steps: 1000, events: 1000, runs: 1000},
        {steps: 500, events: 500, runs: 500},
    ]
    assert deleted.batches == [1000, 1000, 500]
    assert rows_of(ids) == (0, 0, 0)


def test_purge__max_batches_stops_early_and_the_next_call_goes_on() -> None:
    ids = make_runs(25, RunStatus.COMPLETED, created_ago=OLD, steps=1)

    first = store.runs_purge(older_than=RETENTION, batch_size=10, max_batches=2)
    assert first.batches == [10, 10]
    assert WorkflowRun.objects.filter(id__in=ids).count() == 5

    second = store.runs_purge(older_than=RETENTION, batch_size=10, max_batches=2)
    assert second.batches == [5]
    assert WorkflowRun.objects.filter(id__in=ids).count() == 0


def test_purge__batch_size_above_1000_is_refused() -> None:
    with pytest.raises(ValueError, match="1 to 1000"):
        store.runs_purge(older_than=RETENTION, batch_size=1001)


def test_purge__dry_run_counts_and_deletes_nothing() -> None:
    ids = make_runs(3, RunStatus.FAILED, created_ago=OLD, steps=4, events=2)
    make_runs(2, RunStatus.NEEDS_ATTENTION, created_ago=OLD)

    counted = store.runs_purge(older_than=RETENTION, dry_run=True)

    assert (counted.runs, counted.rows, counted.batches) == (3, 3 + 12 + 6, [])
    assert rows_of(ids) == (3, 12, 6)


@contextmanager
def locked_elsewhere(run_id: str) -> Iterator[None]:
    """Another connection holds the run's row lock (an operator's retry in progress)."""
    locked, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                WorkflowRun.objects.select_for_update().get(pk=run_id)
                locked.set()
                release.wait(timeout=30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert locked.wait(timeout=10)
        yield
    finally:
        release.set()
        holder.join()


def test_purge__passes_over_a_run_locked_by_someone_else_without_waiting() -> None:
    busy, *rest = make_runs(3, RunStatus.FAILED, created_ago=OLD)

    with locked_elsewhere(busy):
        deleted = store.runs_purge(older_than=RETENTION)

    assert deleted.runs == 2
    assert rows_of(rest) == (0, 0, 0)
    assert rows_of([busy]) == (1, 2, 1)


def test_delete_runs__by_id_or_workflow_whatever_the_status() -> None:
    mine = make_runs(2, RunStatus.RUNNING, created_ago=NEW, workflow="chaos_like")
    theirs = make_runs(1, RunStatus.COMPLETED, created_ago=NEW, workflow="other")
    bench = make_runs(3, RunStatus.WAITING, created_ago=NEW, workflow="bench_like")

    assert durable.delete_runs(iter(mine)) == 2  # the public API chaos --cleanup uses
    by_workflow = store.runs_delete(workflows=["bench_like"])

    assert (by_workflow.runs, by_workflow.rows) == (3, 3 + 6 + 3)
    assert rows_of(mine) == rows_of(bench) == (0, 0, 0)
    assert rows_of(theirs) == (1, 2, 1)
    with pytest.raises(ValueError):
        store.runs_delete()


def test_purge_command__deletes_and_says_what() -> None:
    make_runs(2, RunStatus.COMPLETED, created_ago=OLD, steps=3, events=1)
    out = io.StringIO()

    call_command("purge", "--older-than", "30d", stdout=out)

    assert out.getvalue().strip() == (
        "deleted 2 workflow runs, 2 run events and 6 step checkpoints in 1 transaction "
        "(finished, older than 30d)"
    )
    assert WorkflowRun.objects.count() == 0


def test_purge_command__units_and_json() -> None:
    make_runs(1, RunStatus.COMPLETED, created_ago=timedelta(hours=3))
    out = io.StringIO()

    call_command("purge", "--older-than", "4h", "--json", stdout=out)
    assert json.loads(out.getvalue())["runs"] == 0
    out = io.StringIO()
    call_command("purge", "--older-than", "150m", "--dry-run", "--json", stdout=out)
    assert json.loads(out.getvalue())["runs"] == 1
    call_command("purge", "--older-than", "7200s", stdout=io.StringIO())
    assert WorkflowRun.objects.count() == 0


@pytest.mark.parametrize(
    ("age", "says"),
    [
        ("30", "is not an age"),
        ("30x", "is not an age"),
        ("-5d", "is not an age"),
        ("1.5d", "is not an age"),
        ("0d", "must be more than 0"),
        ("999999d", "too long ago"),
    ],
)
def test_purge_command__bad_age_is_a_clear_error_and_a_non_zero_exit(age: str, says: str) -> None:
    make_runs(1, RunStatus.COMPLETED, created_ago=OLD)

    done = subprocess.run(
        [sys.executable, "manage.py", "purge", f"--older-than={age}"],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode != 0
    assert says in done.stderr
    assert "Traceback" not in done.stderr
    assert WorkflowRun.objects.count() == 1


class _Sent:
    """The app beat sends through: what it sent, by task name."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def send_task(self, name: str, **options: Any) -> None:
        self.sent.append(name)


class _Base:
    def tick(self) -> float:
        return 5.0


class _Beat(beat.SweeperMixin, _Base):
    def __init__(self) -> None:
        self.app = _Sent()


def later(scheduler: _Beat) -> None:
    """An interval and an hour pass (by the clock the scheduler reads)."""
    scheduler._next_sweep = scheduler._next_retention = time.monotonic()


def test_beat__sweeps_every_interval_and_sends_retention_hourly_unless_0() -> None:
    kept = _Beat()
    with override_settings(AGENTFLOW_RETENTION_DAYS=0, AGENTFLOW_SWEEP_INTERVAL=1):
        assert kept.tick() <= 1.0  # it wakes for the next sweep, not the base's 5 s
        assert not SweeperHeartbeat.objects.exists()  # nothing at start: one interval later
        later(kept)
        kept.tick()
        assert kept.app.sent == []
    assert SweeperHeartbeat.objects.exists()  # it swept, in this process

    hourly = _Beat()
    with override_settings(AGENTFLOW_RETENTION_DAYS=30):
        hourly.tick()
        assert hourly.app.sent == []  # the first an hour after beat starts
        later(hourly)
        hourly.tick()
        hourly.tick()  # within the next hour: not again
    assert hourly.app.sent == [beat.PURGE_TASK]


def test_retention_task__deletes_past_the_setting_and_0_keeps_everything() -> None:
    old = make_runs(1, RunStatus.COMPLETED, created_ago=OLD)
    younger = make_runs(1, RunStatus.COMPLETED, created_ago=timedelta(days=20))

    with override_settings(AGENTFLOW_RETENTION_DAYS=0):
        tasks.purge_task()
    assert rows_of(old) == (1, 2, 1)

    with override_settings(AGENTFLOW_RETENTION_DAYS=30):
        tasks.purge_task()
    assert rows_of(old) == (0, 0, 0)
    assert rows_of(younger) == (1, 2, 1)

    with override_settings(AGENTFLOW_RETENTION_DAYS=10):
        tasks.purge_task()
    assert rows_of(younger) == (0, 0, 0)


SQLITE_SETUP = """
from datetime import timedelta
from pathlib import Path
from django.utils import timezone
from agentflow.models import RunEvent, StepCheckpoint, SupersededStep, WorkflowRun
now = timezone.now()
for status, age in [("COMPLETED", 40), ("FAILED", 40), ("NEEDS_ATTENTION", 40), ("COMPLETED", 1)]:
    run = WorkflowRun.objects.create(workflow="w", version=1, status=status)
    StepCheckpoint.objects.create(
        run=run, seq=1, name="s", kind="read", status="COMPLETED",
        idempotency_key=run.id + "_step_1", first_started_at=now, started_at=now, finished_at=now,
    )
    RunEvent.objects.create(run=run, kind="compensation")
    WorkflowRun.objects.filter(pk=run.pk).update(
        created_at=now - timedelta(days=age), updated_at=now - timedelta(days=age)
    )
"""


def test_purge_command__works_on_the_embedded_sqlite_default(tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
        "AGENTFLOW_VAR_DIR": str(tmp_path),
        "CELERY_BROKER_URL": "agentflowfs://localhost//",
    }

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=settings.BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    manage("migrate", "--noinput", "-v", "0")
    manage("shell", "-c", SQLITE_SETUP)
    report = json.loads(manage("purge", "--older-than", "30d", "--json"))

    assert (report["runs"], report["rows"], report["transactions"]) == (2, 6, 1)
    left = manage(
        "shell",
        "-c",
        "from agentflow.models import WorkflowRun as W; "
        "print(sorted(W.objects.values_list('status', flat=True)))",
    )
    assert left.strip().splitlines()[-1] == "['COMPLETED', 'NEEDS_ATTENTION']"
