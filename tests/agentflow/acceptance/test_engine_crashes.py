"""Crash safety with real processes (docs/protocol.md): SIGKILL, SIGSTOP and a lost broker.

Every test ends with the run COMPLETED, exactly one effect per idempotency key at the partner
stand-in, and every completed step executed once, except the step that was interrupted, whose
re-execution count is asserted exactly.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import transaction

from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus, StepKind, StepStatus
from agentflow._core import dispatch
from agentflow._recovery import sweeper
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.testing.processes import ProcessStartError, RabbitMQServer, publishing_to
from agentflow.testing.waiting import wait_for
from tests.support import partner, workflows
from tests.support.embedded import needs_embedded_broker
from tests.support.processes import INFRA, Workers, log_has

pytestmark = pytest.mark.django_db(transaction=True)

HELD_SEQ = 2  # `hold` in crash_held, `charge` in crash_chain


# --- observing runs -----------------------------------------------------------------------------
def wait_finished(run_id: str, *, timeout: float = 30.0) -> WorkflowRun:
    """The run once it is no longer active (completed, failed or parked)."""

    def finished() -> WorkflowRun | None:
        run = WorkflowRun.objects.filter(pk=run_id).first()
        return run if run is not None and run.status not in ACTIVE_RUN_STATUSES else None

    return wait_for(finished, timeout=timeout, interval=0.02, what=f"run {run_id} to finish")


def wait_execution(run_id: str, step: str, attempt: int = 1) -> dict[str, Any]:
    """The partner's execution row of `step` (its pid is the process running it)."""

    def row() -> dict[str, Any] | None:
        for found in partner.executions(run_id):
            if found["step"] == step and found["attempt"] == attempt:
                return found
        return None

    return wait_for(row, timeout=30, interval=0.02, what=f"{step} attempt {attempt} to start")


def assert_completed_once(
    run_id: str, *, reexecuted: dict[str, int] | None = None, reads_may_repeat: bool = False
) -> None:
    """COMPLETED; each completed step ran once (or as `reexecuted` says; a `read` at least once
    with `reads_may_repeat`, recorded once all the same); one effect per key."""
    reexecuted = reexecuted or {}
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    steps = list(StepCheckpoint.objects.filter(run_id=run_id).order_by("seq"))
    assert all(cp.status == StepStatus.COMPLETED for cp in steps)
    expected = {(run_id, cp.seq, cp.name): reexecuted.get(cp.name, 1) for cp in steps}
    counts = partner.execution_counts(run_id)
    if reads_may_repeat:
        reads = {(run_id, cp.seq, cp.name) for cp in steps if cp.kind == StepKind.READ}
        assert all(counts.get(step, 0) >= 1 for step in reads), counts
        counts = {step: n for step, n in counts.items() if step not in reads}
        expected = {step: n for step, n in expected.items() if step not in reads}
    assert counts == expected
    effect_keys = {cp.idempotency_key for cp in steps if cp.kind == StepKind.EFFECT}
    ours = {key: n for key, n in partner.effects().items() if key.startswith(f"{run_id}_")}
    assert ours == dict.fromkeys(effect_keys, 1)


def key_of(run_id: str, seq: int = HELD_SEQ) -> str:
    return durable.idempotency_key(run_id, seq)


def checkpoint(run_id: str, seq: int = HELD_SEQ) -> StepCheckpoint:
    return StepCheckpoint.objects.get(run_id=run_id, seq=seq)


# --- (a) named crash points ---------------------------------------------------------------------
#: point -> (executions of `charge`, requests at the partner, attempts on its checkpoint)
CRASH_POINTS = {
    "after_claim": (1, 1, 2),  # died before the effect: the retry makes it, once
    "after_effect": (2, 2, 2),  # effect made, checkpoint not: the retry replays the same key
    "after_complete": (1, 1, 1),  # checkpoint committed, next step lost with the process
}


#: The `after_effect` crash on every broker and through PgBouncer too; the other points on Redis.
CRASH_CASES = [(point, "redis") for point in CRASH_POINTS] + [
    ("after_effect", "rabbitmq"),
    ("after_effect", "pgbouncer"),
]


@pytest.mark.parametrize(("point", "infra"), CRASH_CASES, indirect=["infra"])
def test_crash_point__child_kills_itself__redelivered_step_takes_over(
    point: str, workers: Workers
) -> None:
    worker = workers.start(AGENTFLOW_FAULTS="1", AGENTFLOW_CRASH_AT=f"charge:{point}")
    run_id = durable.start(workflows.chain.name)

    wait_finished(run_id)

    executions, requests, attempts = CRASH_POINTS[point]
    assert log_has(worker, f"fault injection: SIGKILL at charge:{point}")
    assert_completed_once(run_id, reexecuted={"charge": executions})
    assert partner.requests()[key_of(run_id)] == requests
    charge = checkpoint(run_id)
    assert charge.attempts == attempts
    # The redelivered message alone recovered the run: after a claim, its owner's freed lock
    # let it take over at once (not the lease); after the completion, it found the step done
    # and published the next one (no takeover at all).
    takeovers = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.TAKEOVER)
    expected = [] if point == "after_complete" else [(HELD_SEQ, "owner_gone", 2)]
    assert [(e.seq, e.data["reason"], e.data["attempt"]) for e in takeovers] == expected
    # Wall clock of this host throughout: the partner's rows and the claim's start time.
    rows = partner.executions(run_id)
    first_charge = next(row["at"] for row in rows if row["step"] == "charge")
    crashed_at = charge.first_started_at.timestamp() if point == "after_claim" else first_charge
    done_at = next(row["at"] for row in rows if row["step"] == "finish")
    print(f"\nrecovery after child crash at charge:{point}: {done_at - crashed_at:.2f} s")
    assert done_at - crashed_at < django_settings.AGENTFLOW_LEASE_SECONDS  # no lease wait


def test_crash_point_on_a_read_step__crashes_once_then_completes(workers: Workers) -> None:
    workers.start(AGENTFLOW_FAULTS="1", AGENTFLOW_CRASH_AT="prepare:after_effect")
    run_id = durable.start(workflows.chain.name)

    wait_finished(run_id, timeout=15)

    assert_completed_once(run_id, reexecuted={"prepare": 2})


# --- (b) a prefork child killed mid-step --------------------------------------------------------
def test_child_sigkill_mid_step__step_redelivered_and_rerun_once(workers: Workers) -> None:
    worker = workers.start()
    run_id = durable.start(workflows.held.name)
    child = wait_execution(run_id, "hold")["pid"]
    assert child in worker.children()

    killed_at = time.monotonic()
    os.kill(child, signal.SIGKILL)
    partner.release(run_id)
    wait_finished(run_id)
    recovered = time.monotonic() - killed_at

    print(f"\nrecovery after child SIGKILL mid-step: {recovered:.2f} s")
    assert_completed_once(run_id, reexecuted={"hold": 2})
    assert partner.requests()[key_of(run_id)] == 1  # the killed attempt never reached it
    assert checkpoint(run_id).attempts == 2
    assert worker.alive()


# --- (c) the whole worker killed mid-step -------------------------------------------------------
@pytest.mark.parametrize("infra", INFRA, indirect=True)
def test_whole_worker_sigkill_mid_step__sweeper_of_a_fresh_worker_resumes(
    workers: Workers, infra: str
) -> None:
    first = workers.start()  # default lease (10 s) and sweep interval (5 s)
    run_id = durable.start(workflows.held.name)
    wait_execution(run_id, "hold")

    killed_at = time.monotonic()
    first.kill()
    partner.release(run_id)
    workers.start(beat=True)
    wait_finished(run_id, timeout=40)
    recovered = time.monotonic() - killed_at

    print(f"\nrecovery after whole-worker SIGKILL (lease 10 s + sweep 5 s): {recovered:.2f} s")
    assert_completed_once(run_id, reexecuted={"hold": 2})
    assert partner.requests()[key_of(run_id)] == 1
    requeued = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SWEEP_REQUEUE).exists()
    # On Redis the dead worker's unacked message stays invisible for the visibility timeout, so
    # only the sweeper brings the run back. RabbitMQ gives the message back the moment the dead
    # consumer's connection closes: the fresh worker may take it before any sweep is due.
    assert requeued or infra == "rabbitmq"


# --- (d) the broker restarted empty -------------------------------------------------------------
def test_broker_restart_loses_queued_steps__sweeper_republishes_them(
    workers: Workers, broker: Any, settings: Any
) -> None:
    settings.AGENTFLOW_LEASE_SECONDS = 2  # the enqueue grace these runs are created with
    run_ids = [durable.start(workflows.chain.name) for _ in range(5)]
    assert broker.queue_length() == len(run_ids)

    broker.restart()
    assert broker.queue_length() == 0
    workers.start(beat=True, AGENTFLOW_LEASE_SECONDS="2", AGENTFLOW_SWEEP_INTERVAL="1")

    for run_id in run_ids:
        wait_finished(run_id)
        assert_completed_once(run_id)
        assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SWEEP_REQUEUE).exists()


@pytest.fixture
def rabbitmq_node(tmp_path: Path) -> Iterator[RabbitMQServer]:
    """A RabbitMQ node of this test's own: the machine's is shared, so never restarted."""
    node = RabbitMQServer(tmp_path / "rabbitmq")
    try:
        node.start()
    except ProcessStartError as exc:
        node.kill()
        if os.environ.get("CI") == "true":
            pytest.fail(f"no private RabbitMQ node: {exc}")
        pytest.skip(f"no private RabbitMQ node: {exc}")
    with publishing_to(node.url):
        yield node
    node.kill()


def test_rabbitmq_killed_and_restarted_with_steps_in_flight__nothing_lost_none_repeated(
    workers: Workers, rabbitmq_node: RabbitMQServer
) -> None:
    """Durable queue, persistent messages (Celery's defaults): what the node held comes back
    after a SIGKILL; the running steps' messages come back too (redelivered) and find their
    steps claimed by a live owner, which finishes them once. A redelivered message of a step
    already done republishes its successor (docs/protocol.md, "One step, in order", step 2: its own
    completion's message may have been lost with a crash), so a `read` successor may run twice
    beside its completion's copy: recorded once, and no effect is ever repeated."""
    workers.start(
        concurrency=2, beat=True, CELERY_BROKER_URL=rabbitmq_node.url, AGENTFLOW_SWEEP_INTERVAL="1"
    )
    run_ids = [durable.start(workflows.held.name) for _ in range(4)]

    def holding() -> bool:
        return (
            sum(
                any(row["step"] == "hold" for row in partner.executions(run_id))
                for run_id in run_ids
            )
            == 2
        )

    wait_for(holding, timeout=30, interval=0.05, what="two effect steps in flight")

    rabbitmq_node.restart()
    for run_id in run_ids:
        partner.release(run_id)

    for run_id in run_ids:
        wait_finished(run_id, timeout=60)
        # Each effect ran once and each step was recorded once: nothing repeated, nothing lost.
        assert_completed_once(run_id, reads_may_repeat=True)


# --- (e) two workers racing for one step --------------------------------------------------------
def test_two_workers_get_the_same_step__exactly_one_claims(workers: Workers, broker: Any) -> None:
    pair = [workers.start(), workers.start()]
    with transaction.atomic():
        run_id = durable.start(workflows.race.name)
        dispatch.send_step_on_commit(run_id, 1)  # the same (run, seq) message, twice at once

    winner = wait_execution(run_id, "hold")["pid"]
    assert any(winner in worker.children() for worker in pair)
    # Each worker took one copy (the queue is empty) and the loser's is done and acked while
    # the winner holds: only the winner's stays unacked at the broker.
    wait_for(
        lambda: broker.queue_length() == 0 and broker.client().hlen("unacked") == 1,
        timeout=30,
        what="the losing copy to be handled",
    )
    assert len(partner.executions(run_id)) == 1
    assert checkpoint(run_id, 1).attempts == 1

    partner.release(run_id)
    wait_finished(run_id)
    assert_completed_once(run_id)


# --- (f) a paused worker wakes up after being taken over ----------------------------------------
def test_paused_worker_resumes_after_takeover__its_late_completion_is_fenced_out(
    workers: Workers, settings: Any
) -> None:
    settings.AGENTFLOW_LEASE_SECONDS = 2
    paused = workers.start(AGENTFLOW_LEASE_SECONDS="2")
    run_id = durable.start(workflows.held.name)
    assert wait_execution(run_id, "hold")["pid"] in paused.children()

    workers.signal(paused, signal.SIGSTOP)
    partner.release(run_id)
    taker = workers.start(AGENTFLOW_LEASE_SECONDS="2")
    # This test is the sweeper: once the paused lease is past, the run goes to `taker`.
    wait_for(lambda: run_id in sweeper.sweep().requeued, timeout=30, what="lease to expire")
    wait_finished(run_id)
    assert wait_execution(run_id, "hold", attempt=2)["pid"] in taker.children()
    before = _rows(run_id)

    workers.signal(paused, signal.SIGCONT)
    wait_for(lambda: partner.requests()[key_of(run_id)] == 2, what="the late partner call")
    wait_for(lambda: log_has(paused, "fenced out, result discarded"), what="the fenced completion")

    steps, run, events = _rows(run_id)
    assert (steps, run) == before[:2]  # I5: the fenced-out worker changed nothing
    late = [e for e in events if e not in before[2]]  # ... but what it did is kept, for audit
    assert [(e["kind"], e["seq"], e["data"]["attempt"]) for e in late] == [
        (RunEvent.Kind.LATE_COMPLETION, HELD_SEQ, 1)
    ]
    assert late[0]["data"]["output"] == {"key": key_of(run_id), "replayed": True}
    assert_completed_once(run_id, reexecuted={"hold": 2})


def _rows(run_id: str) -> tuple[list[dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    steps = list(StepCheckpoint.objects.filter(run_id=run_id).order_by("seq").values())
    run = WorkflowRun.objects.filter(pk=run_id).values().get()
    return steps, run, list(RunEvent.objects.filter(run_id=run_id).values())


# --- a deploy changed the definition under a queued run -----------------------------------------
def test_worker_deployed_with_v2__takes_the_v1_run_that_recorded_nothing_it_lacks(
    workers: Workers, broker: Any
) -> None:
    """docs/deploys.md, "Builds": the v1 run recorded no step, and the step it is at is v2's too, so
    the newer build takes it by rule and it finishes on v2's steps, instead of being parked."""
    run_id = durable.start(workflows.deployed.name)  # v1, here in the test process
    assert broker.queue_length() == 1

    workers.start(TEST_WORKFLOWS_DEPLOY="2", AGENTFLOW_BUILD_ID="suite-v2")
    run = wait_finished(run_id)

    assert run.status == RunStatus.COMPLETED, run.error
    assert (run.version, run.build, run.started_build) == (2, "suite-v2", "suite")
    assert list(run.steps.values_list("name", "build")) == [
        ("prepare", "suite-v2"),
        ("charge_v2", "suite-v2"),
    ]
    moved = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.UPGRADED)
    assert moved.data == {"from": "suite", "to": "suite-v2", "version": 2}
    assert not RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.VERSION_MISMATCH)


# --- (g) the embedded default: SQLite and the filesystem broker ---------------------------------
@needs_embedded_broker
def test_embedded_default__whole_worker_killed__only_the_sweeper_saves_the_run(
    workers: Workers, worker_env: Any, tmp_path: Path
) -> None:
    home = tmp_path / "embedded"
    home.mkdir()
    db = home / "db.sqlite3"
    env = worker_env(
        DATABASE_URL=f"sqlite:///{db}",
        CELERY_BROKER_URL="",  # empty means unset: the filesystem transport under var/broker
        REDIS_URL="",
        AGENTFLOW_VAR_DIR=str(home),
        AGENTFLOW_LEASE_SECONDS="3",
        AGENTFLOW_SWEEP_INTERVAL="1",
    )
    _manage(env, "migrate", "--noinput")
    first = workers.start(env=env)
    run_id = _manage(env, "start_workflow", workflows.held.name).strip()
    assert run_id.startswith("wf_")
    wait_execution(run_id, "hold")

    first.kill()
    partner.release(run_id)
    assert not list((home / "broker" / "queue").iterdir())  # the in-flight message died too
    workers.start(env=env, beat=True)

    def status() -> str | None:
        found = _sqlite(db, "SELECT status FROM agentflow_workflowrun WHERE id = ?", run_id)
        return found[0][0] if found and found[0][0] == RunStatus.COMPLETED else None

    wait_for(status, timeout=40, what="the embedded run to complete")
    steps = _sqlite(
        db, "SELECT seq, name, status FROM agentflow_stepcheckpoint WHERE run_id = ?", run_id
    )
    assert sorted(steps) == [
        (1, "prepare", "COMPLETED"),
        (2, "hold", "COMPLETED"),
        (3, "finish", "COMPLETED"),
    ]
    assert partner.execution_counts(run_id) == {
        (run_id, 1, "prepare"): 1,
        (run_id, 2, "hold"): 2,
        (run_id, 3, "finish"): 1,
    }
    assert partner.effects() == {key_of(run_id): 1}
    assert _sqlite(
        db,
        "SELECT 1 FROM agentflow_runevent WHERE run_id = ? AND kind = ?",
        run_id,
        RunEvent.Kind.SWEEP_REQUEUE,
    )


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        env={**os.environ, **env},
        cwd=django_settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _sqlite(db: Path, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(db, timeout=30)) as conn:
        return conn.execute(query, args).fetchall()
