"""The recovery sweeper (docs/protocol.md, "The sweeper") against real Postgres and a real Redis
broker, no worker."""

from __future__ import annotations

import json
import threading
from base64 import b64decode
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connections
from django.db.models import F
from django.db.models.functions import Now
from django.utils import timezone

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow._recovery import sweeper
from agentflow.models import RunEvent, WorkflowRun
from agentflow.testing.processes import publishing_to
from agentflow.testing.waiting import wait_for
from tests.support import workflows
from tests.support.processes import RedisServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def lost_runs(engine: RedisServer, count: int, settings: Any) -> list[str]:
    """Runs whose first-step messages the broker lost, already past their enqueue grace."""
    settings.AGENTFLOW_LEASE_SECONDS = 1
    run_ids = [durable.start(workflows.chain.name) for _ in range(count)]
    engine.client().flushall()
    wait_for(lambda: not WorkflowRun.objects.filter(wake_at__gt=timezone.now()).exists())
    return run_ids


def published(engine: RedisServer) -> list[tuple[str, int]]:
    """(run id, seq) of every step message waiting in the broker's step queue."""
    found = []
    for raw in engine.queued_messages():
        run_id, seq = json.loads(b64decode(json.loads(raw)["body"]))[0]
        found.append((run_id, seq))
    return found


def requeue_events(run_id: str) -> int:
    return RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SWEEP_REQUEUE).count()


def test_sweep__run_past_its_grace__republished_with_an_event(
    engine: RedisServer, settings: Any
) -> None:
    [run_id] = lost_runs(engine, 1, settings)

    report = sweeper.sweep()

    assert report.requeued == [run_id]
    assert published(engine) == [(run_id, 1)]
    assert requeue_events(run_id) == 1
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.wake_at is not None and run.wake_at > timezone.now()  # not again at once
    assert sweeper.sweep().requeued == []


def test_sweep__run_inside_its_grace__left_alone(engine: RedisServer) -> None:
    run_id = durable.start(workflows.chain.name)  # default grace: 10 s
    engine.client().flushall()

    report = sweeper.sweep()

    assert report.requeued == [] and report.parked == []
    assert engine.queue_length() == 0
    assert requeue_events(run_id) == 0


def test_sweep__terminal_and_parked_runs__never_touched(engine: RedisServer) -> None:
    past = timezone.now() - timedelta(minutes=5)
    for status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.NEEDS_ATTENTION):
        WorkflowRun.objects.create(
            workflow=workflows.chain.name,
            version=1,
            status=status,
            current_step="charge",
            current_seq=2,
            updated_at=past,
        )

    assert sweeper.sweep().requeued == []
    assert engine.queue_length() == 0


def test_sweep__one_broken_run__skipped_and_the_rest_still_republished(
    engine: RedisServer, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = lost_runs(engine, 3, settings)
    past = timezone.now() - timedelta(seconds=30)
    broken = WorkflowRun.objects.create(
        workflow=workflows.chain.name,
        version=1,
        status=RunStatus.RUNNING,
        current_step="charge",
        current_seq=2,
        wake_at=past,
        build="gone",
        pinned=True,
    )
    real_hold = store.run_hold

    def hold(run_id: str, *args: Any, **kwargs: Any) -> bool:
        if run_id == broken.id:
            raise DatabaseError("this row is broken")
        return real_hold(run_id, *args, **kwargs)

    monkeypatch.setattr(store, "run_hold", hold)

    report = sweeper.sweep()

    assert [error.split(":")[0] for error in report.errors] == [broken.id]
    assert sorted(report.requeued) == sorted(good)
    assert sorted(published(engine)) == sorted((run_id, 1) for run_id in good)
    broken.refresh_from_db()
    assert broken.status == RunStatus.RUNNING and broken.hold == ""  # left for the next sweep


def test_sweep__pinned_run_of_a_build_without_workers__held_with_the_reason_not_published(
    engine: RedisServer, settings: Any
) -> None:
    good = lost_runs(engine, 1, settings)
    past = timezone.now() - timedelta(seconds=30)
    pinned = WorkflowRun.objects.create(
        workflow=workflows.chain.name,
        version=1,
        status=RunStatus.RUNNING,
        current_step="charge",
        current_seq=2,
        wake_at=past,
        build="old",
        pinned=True,
    )

    report = sweeper.sweep()

    assert report.held == [pinned.id] and report.requeued == good
    assert published(engine) == [(good[0], 1)]  # nothing for a queue nobody reads
    pinned.refresh_from_db()
    assert (pinned.status, pinned.hold) == (RunStatus.WAITING, "build:old")
    assert pinned.wake_at is not None and pinned.wake_at > timezone.now()
    event = RunEvent.objects.get(run_id=pinned.id, kind=RunEvent.Kind.HELD)
    assert event.detail == "waiting for a worker of build old"
    # Looked at again later: still held, no second event.
    WorkflowRun.objects.filter(pk=pinned.id).update(wake_at=past)
    again = sweeper.sweep()
    assert again.requeued == [] and again.held == []
    assert RunEvent.objects.filter(run_id=pinned.id, kind=RunEvent.Kind.HELD).count() == 1


def test_sweep__two_sweepers_at_once__each_run_republished_exactly_once(
    engine: RedisServer, settings: Any
) -> None:
    run_ids = lost_runs(engine, 30, settings)
    barrier = threading.Barrier(2)

    def sweep_once() -> list[str]:
        try:
            barrier.wait(timeout=10)
            return sweeper.sweep().requeued
        finally:
            connections.close_all()

    with ThreadPoolExecutor(2) as pool:
        reports = list(pool.map(lambda _: sweep_once(), range(2)))

    swept = [run_id for report in reports for run_id in report]
    assert sorted(swept) == sorted(run_ids)
    assert sorted(published(engine)) == sorted((run_id, 1) for run_id in run_ids)
    assert all(requeue_events(run_id) == 1 for run_id in run_ids)


def ring_gaps(run_id: str) -> list[float]:
    """The gap each of the run's re-publishes left before the next (its events, oldest first)."""
    events = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SWEEP_REQUEUE)
    return [event.data["next_seconds"] for event in events.order_by("id")]


def test_sweep__rung_and_unanswered__the_gap_grows_until_a_worker_answers(
    engine: RedisServer, settings: Any
) -> None:
    [run_id] = lost_runs(engine, 1, settings)  # a lease of 1 s
    past = Now() - timedelta(seconds=1)

    assert sweeper.sweep().requeued == [run_id]  # the first ring: one lease
    # No worker answered for 10 s since (the run's times moved back, as a queue's wait would).
    WorkflowRun.objects.filter(pk=run_id).update(
        rung_at=F("rung_at") - timedelta(seconds=10),
        updated_at=F("updated_at") - timedelta(seconds=10),
        wake_at=past,
    )
    assert sweeper.sweep().requeued == [run_id]
    # A worker writes the run (a claim, an advance, a wait): the next ring starts over.
    WorkflowRun.objects.filter(pk=run_id).update(updated_at=Now(), wake_at=past)
    assert sweeper.sweep().requeued == [run_id]

    first, unanswered, answered = ring_gaps(run_id)
    assert first == 1.0 and answered == 1.0
    assert 11.0 <= unanswered < 13.0  # 10 s unanswered + one lease
    assert WorkflowRun.objects.get(pk=run_id).wake_at > timezone.now()


def test_sweep__the_broker_refuses__the_back_off_starts_over(
    engine: RedisServer, settings: Any
) -> None:
    [run_id] = lost_runs(engine, 1, settings)
    WorkflowRun.objects.filter(pk=run_id).update(
        rung_at=Now() - timedelta(seconds=30), updated_at=Now() - timedelta(seconds=31)
    )
    with publishing_to("redis://127.0.0.1:1/0"):  # nothing listens there
        assert sweeper.sweep().requeued == [run_id]

    run = WorkflowRun.objects.get(pk=run_id)
    assert run.rung_at is None  # no ring: the next one is a first ring again, one lease on
    assert run.wake_at is not None
    assert run.wake_at <= timezone.now() + timedelta(seconds=2)
