"""Builds side by side (docs/deploys.md, "Builds", issue 26), with real worker processes of two
builds on one database and broker: a pinned run waits for a worker of its own build and runs no
other build's code; a run that moved to a newer build is never run by the older one after a
rollback; a run backing off and a run compensating move to the new build when the old worker is
SIGKILLed while draining, each effect made once.

The test process plays each build's web in turn (`AGENTFLOW_BUILD_ID` in its settings).
"""

from __future__ import annotations

from typing import Any

import pytest

from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow._core import dispatch
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.testing.waiting import wait_for
from tests.agentflow.acceptance.test_engine_crashes import wait_finished
from tests.support import partner, workflows
from tests.support.processes import Workers

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"AGENTFLOW_LEASE_SECONDS": "2", "AGENTFLOW_SWEEP_INTERVAL": "1"}


def held_for(run_id: str, build: str) -> durable.RunSnapshot:
    def found() -> durable.RunSnapshot | None:
        run = durable.snapshot(run_id)
        return (
            run
            if run is not None and run.held == f"waiting for a worker of build {build}"
            else None
        )

    return wait_for(found, timeout=30, interval=0.05, what=f"{run_id} to wait for build {build}")


def builds_of_steps(run_id: str) -> list[tuple[str, str]]:
    return list(StepCheckpoint.objects.filter(run_id=run_id).values_list("name", "build"))


def effects_once(run_id: str) -> None:
    """I1, counted at the partner: one effect per key of this run."""
    ours = {key: n for key, n in partner.effects().items() if key.startswith(f"{run_id}_")}
    assert ours and set(ours.values()) == {1}, ours


def test_pinned_run__no_worker_of_its_build__waits_with_the_reason__its_own_worker_finishes_it(
    workers: Workers, settings: Any
) -> None:
    settings.AGENTFLOW_BUILD_ID = "p1"
    run_id = durable.start(workflows.pinned.name)
    assert WorkflowRun.objects.filter(pk=run_id, build="p1", pinned=True).exists()

    settings.AGENTFLOW_BUILD_ID = "p2"  # p1's processes are all gone; p2 is deployed
    workers.start(AGENTFLOW_BUILD_ID="p2", beat=True, **FAST)
    dispatch.send_step(run_id, 1)  # a message on the shared queue: p2's worker takes it
    run = held_for(run_id, "p1")

    assert run.status == RunStatus.WAITING
    assert partner.executions(run_id) == []  # no code of p2 ran any of it
    event = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.HELD)
    assert event.detail == "waiting for a worker of build p1"

    workers.start(AGENTFLOW_BUILD_ID="p1", **FAST)  # one worker of its build
    done = wait_finished(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert builds_of_steps(run_id) == [("prepare", "p1"), ("charge", "p1"), ("finish", "p1")]
    effects_once(run_id)
    # Whoever let it go said so (I6): its worker's first beat (released), or the sweeper's
    # recheck if that came first, which a loaded machine's slow worker start allows.
    let_go = {RunEvent.Kind.RELEASED, RunEvent.Kind.SWEEP_REQUEUE}
    assert RunEvent.objects.filter(run_id=run_id, kind__in=let_go, id__gt=event.id).exists()


def test_rollback__a_run_moved_to_the_newer_build__never_run_by_the_older_one(
    workers: Workers, settings: Any
) -> None:
    settings.AGENTFLOW_BUILD_ID = "a"
    run_id = durable.start(workflows.rollback.name)  # on build a, which no worker runs yet

    newer = workers.start(AGENTFLOW_BUILD_ID="b", **FAST)  # b: first seen after a
    wait_for(
        lambda: durable.snapshot(run_id).waiting_for == "signal",  # type: ignore[union-attr]
        timeout=30,
        what="the run to move to b and wait for its signal",
    )
    moved = WorkflowRun.objects.get(pk=run_id)
    assert (moved.build, moved.started_build) == ("b", "a")
    assert builds_of_steps(run_id) == [("prepare", "b")]

    newer.kill()  # the rollback: b's workers are gone, a's come back
    workers.start(AGENTFLOW_BUILD_ID="a", beat=True, **FAST)
    assert durable.signal(run_id, "reply", {"ok": True}, signal_id="s-1") == "delivered"
    run = held_for(run_id, "b")

    assert run.build == "b"
    assert builds_of_steps(run_id) == [("prepare", "b")]  # a ran nothing of it
    pinned = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.PINNED)
    assert "newer than this one (a)" in pinned.detail

    workers.start(AGENTFLOW_BUILD_ID="b", **FAST)  # roll forward again
    done = wait_finished(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert {build for _, build in builds_of_steps(run_id)} == {"b"}
    effects_once(run_id)


def test_backing_off_across_a_deploy__the_old_worker_sigkilled__the_new_build_retries_once(
    workers: Workers, settings: Any
) -> None:
    settings.AGENTFLOW_BUILD_ID = "a"
    old = workers.start(AGENTFLOW_BUILD_ID="a", **FAST)
    run_id = durable.start(workflows.flaky.name)  # a 503, then a back-off of about 2 s
    wait_for(
        lambda: WorkflowRun.objects.filter(pk=run_id, status=RunStatus.WAITING).exists(),
        timeout=30,
        what="the run to back off",
    )
    old.kill()  # SIGKILLed while draining

    settings.AGENTFLOW_BUILD_ID = "b"
    workers.start(AGENTFLOW_BUILD_ID="b", beat=True, **FAST)  # its sweeper wakes the run
    done = wait_finished(run_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert builds_of_steps(run_id) == [("charge", "b"), ("finish", "b")]
    upgraded = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.UPGRADED)
    assert upgraded.data["from"] == "a" and upgraded.data["to"] == "b"
    effects_once(run_id)
    assert not RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.NEEDS_ATTENTION)


def test_compensating_across_a_deploy__old_worker_sigkilled_mid_undo__undone_once_by_the_new(
    workers: Workers, settings: Any
) -> None:
    settings.AGENTFLOW_BUILD_ID = "a"
    old = workers.start(AGENTFLOW_BUILD_ID="a", **FAST)
    run_id = durable.start(workflows.undo_held.name)
    wait_for(
        lambda: StepCheckpoint.objects.filter(run_id=run_id, name="unbook").exists(),
        timeout=30,
        what="the compensation to start on build a",
    )
    old.kill()  # SIGKILLed in the middle of undoing: the unbook call may have been sent

    settings.AGENTFLOW_BUILD_ID = "b"
    workers.start(AGENTFLOW_BUILD_ID="b", beat=True, **FAST)
    partner.release(run_id)
    done = wait_finished(run_id)

    assert done.status == RunStatus.FAILED
    steps = builds_of_steps(run_id)
    assert [name for name, _ in steps] == ["book", "confirm", "unbook", "notify"]
    assert steps[-2:] == [("unbook", "b"), ("notify", "b")]
    effects_once(run_id)  # booked once, unbooked once, told once
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.UPGRADED).exists()
