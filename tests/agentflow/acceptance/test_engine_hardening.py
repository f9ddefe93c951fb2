"""Engine hardening with real processes: fences that only grow, the database's clock, liveness
from Postgres, the embedded broker's redeliveries, and a broker restart under load.

Each test fails on the engine before these changes (the reason is in its docstring).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest

from agentflow import durable
from agentflow._base.states import RunStatus, StepStatus
from agentflow._core import dispatch
from agentflow._recovery import sweeper
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.testing.waiting import wait_for
from tests.agentflow.acceptance.test_engine_crashes import (
    HELD_SEQ,
    _manage,
    _rows,
    _sqlite,
    assert_completed_once,
    checkpoint,
    key_of,
    wait_execution,
    wait_finished,
)
from tests.support import partner, workflows
from tests.support.embedded import needs_embedded_broker
from tests.support.processes import Workers, log_has

pytestmark = pytest.mark.django_db(transaction=True)


def executions(run_id: str, step: str) -> list[dict[str, Any]]:
    return [row for row in partner.executions(run_id) if row["step"] == step]


# --- fences only grow (finding 2) ---------------------------------------------------------------
def test_aba__owner_paused_since_attempt_1__wakes_after_an_operator_retry_and_changes_nothing(
    workers: Workers, settings: Any
) -> None:
    """An operator retry used to reset attempts, so the retry's attempt 1 had the fence of the
    paused owner's attempt 1, whose late completion then passed it."""
    settings.AGENTFLOW_LEASE_SECONDS = 2
    paused = workers.start(AGENTFLOW_LEASE_SECONDS="2")
    run_id = durable.start(workflows.aba.name)
    assert wait_execution(run_id, "charge")["pid"] in paused.children()

    workers.signal(paused, signal.SIGSTOP)
    taker = workers.start(AGENTFLOW_LEASE_SECONDS="2")
    wait_for(lambda: run_id in sweeper.sweep().requeued, timeout=30, what="the lease to expire")
    failed = wait_finished(run_id)  # the takeover: the partner refuses, for good
    assert failed.status == RunStatus.FAILED and failed.error == "charge: card declined"

    durable.retry(run_id, actor="ops", reason="the customer updated their card")
    wait_for(lambda: len(executions(run_id, "charge")) == 3, what="the retry's attempt")
    assert executions(run_id, "charge")[2]["pid"] in taker.children()
    retried = checkpoint(run_id)
    assert (retried.status, retried.attempts) == (StepStatus.IN_PROGRESS, 1)  # a fresh budget
    before = _rows(run_id)

    partner.release(f"{run_id}/1")
    workers.signal(paused, signal.SIGCONT)  # the owner of attempt 1 wakes and finishes
    wait_for(lambda: log_has(paused, "fenced out, result discarded"), what="its late completion")

    steps, run, events = _rows(run_id)
    assert (steps, run) == before[:2]  # I5: the retry's attempt 1 is still in flight, untouched
    late = [e for e in events if e not in before[2]]
    assert [(e["kind"], e["data"]["fence"]) for e in late] == [(RunEvent.Kind.LATE_COMPLETION, 1)]
    assert retried.fence > 1

    partner.release(f"{run_id}/3")
    assert wait_finished(run_id).status == RunStatus.COMPLETED
    assert partner.effects() == {key_of(run_id): 1}  # the late call made it; the retry replayed


# --- the database's clock (finding 3) -----------------------------------------------------------
def test_clock__a_sweeper_running_5_s_ahead__wakes_a_retry_on_time_never_early(
    workers: Workers, broker: Any
) -> None:
    """The sweeper used to decide due-ness with its own clock: 5 s ahead (with a 3 s grace),
    it re-published the waiting run before its retry time, the worker dropped it as an early
    duplicate, and the run woke late."""
    steps = workers.start(queues="celery", AGENTFLOW_LEASE_SECONDS="3")
    run_id = durable.start(workflows.patient.name)
    failed = wait_for(
        lambda: StepCheckpoint.objects.filter(
            run_id=run_id, seq=1, status=StepStatus.FAILED
        ).first(),
        what="the first attempt to fail",
    )
    assert failed.retry_at is not None
    steps.kill()  # its back-off message dies with it (if it had taken it) ...
    broker.client().flushall()  # ... or with the broker: only the sweeper can wake the run now
    workers.start(queues="celery", AGENTFLOW_LEASE_SECONDS="3")
    sweeper = workers.start(  # its embedded beat sweeps, in a process whose clock runs ahead
        queues="no-steps-here",
        beat=True,
        AGENTFLOW_LEASE_SECONDS="3",
        AGENTFLOW_SWEEP_INTERVAL="1",
        AGENTFLOW_FAULTS="1",
        AGENTFLOW_CLOCK_OFFSET_SECONDS="5",
    )
    assert log_has(sweeper, "clock runs +5.0 s off")

    run = wait_finished(run_id, timeout=30)

    assert run.status == RunStatus.COMPLETED
    woke = StepCheckpoint.objects.get(run_id=run_id, seq=1).started_at
    sweeps = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SWEEP_REQUEUE)
    # Woken by the sweeper, never before the retry time by the database's clock (the bug's
    # early re-publish was dropped as a duplicate). Not a timed bound: how soon after the retry
    # time the workers were up to take it depends on the machine's load, not on the protocol.
    assert sweeps.exists() and all(event.at >= failed.retry_at for event in sweeps)
    assert failed.retry_at <= sweeps.order_by("at")[0].at <= woke


# --- liveness from Postgres (finding 4) ---------------------------------------------------------
PID_NAMESPACE = ["unshare", "--pid", "--fork", "--mount-proc"]


def namespaced_pids(worker: Any) -> set[int]:
    """The pool children's pids as their own PID namespace numbers them (what they record)."""
    found = set()
    for pid in worker.children():
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    found.add(int(line.split()[-1]))
    return found


def test_liveness__same_hostname_separate_pid_namespaces__no_steal_and_takeover_within_2_s(
    workers: Workers, broker: Any
) -> None:
    """Owners used to be judged by pid on 'this host': in another PID namespace under the same
    hostname, a live owner's pid looked dead (or recycled), so a duplicate stole its step."""
    first = workers.start(wrapper=PID_NAMESPACE, AGENTFLOW_HOSTNAME="shared-host")
    run_id = durable.start(workflows.held.name)
    assert wait_execution(run_id, "hold")["pid"] in namespaced_pids(first)
    owner = checkpoint(run_id).lease_owner
    second = workers.start(wrapper=PID_NAMESPACE, AGENTFLOW_HOSTNAME="shared-host")

    dispatch.send_step(run_id, HELD_SEQ)  # a duplicate of the held step's message
    # Handled and acked by `second`: only the held original stays unacked at the broker.
    wait_for(
        lambda: broker.queue_length() == 0 and broker.client().hlen("unacked") == 1,
        what="the duplicate to be handled",
    )
    assert sweeper.sweep().requeued == []  # the owner's lock is held: it is alive

    assert len(executions(run_id, "hold")) == 1
    assert checkpoint(run_id).lease_owner == owner

    first.kill()
    killed_at = time.time()
    wait_for(
        lambda: run_id in sweeper.sweep().requeued,
        timeout=10,
        interval=0.1,
        what="the sweeper to see the owner gone",
    )
    taker = wait_execution(run_id, "hold", attempt=2)["pid"]
    assert taker in namespaced_pids(second)
    assert namespaced_pids(first) == set() and checkpoint(run_id).lease_owner != owner
    takeover = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.TAKEOVER)
    assert takeover.data["reason"] == "owner_gone"
    assert takeover.at.timestamp() - killed_at <= 2.0

    partner.release(run_id)
    wait_finished(run_id)
    assert_completed_once(run_id, reexecuted={"hold": 2})


# --- the embedded broker's redeliveries (finding 5) ---------------------------------------------
@needs_embedded_broker
def test_embedded_broker__a_read_step_that_kills_its_worker__parked_at_the_attempt_bound(
    workers: Workers, worker_env: Any, tmp_path: Path
) -> None:
    """kombu's filesystem transport gave a message back without `delivery_info.redelivered`,
    so the lost attempts were never counted and the step killed its worker for ever."""
    home = tmp_path / "embedded"
    home.mkdir()
    db = home / "db.sqlite3"
    env = worker_env(
        DATABASE_URL=f"sqlite:///{db}",
        CELERY_BROKER_URL="",
        REDIS_URL="",
        AGENTFLOW_VAR_DIR=str(home),
        AGENTFLOW_MAX_ATTEMPTS="2",
    )
    _manage(env, "migrate", "--noinput")
    workers.start(env=env)
    run_id = _manage(env, "start_workflow", workflows.suicidal.name).strip()

    def parked() -> str | None:
        found = _sqlite(db, "SELECT status, error FROM agentflow_workflowrun WHERE id = ?", run_id)
        return found[0][1] if found and found[0][0] == RunStatus.NEEDS_ATTENTION else None

    assert wait_for(parked, timeout=60, what="the run to be parked") == (
        "die killed its worker 2 times"
    )
    assert len(executions(run_id, "die")) == 2


# --- a broker restart under load (finding 8) ----------------------------------------------------
def test_redis_restart_with_20_effect_steps_in_flight__none_parked_none_repeated(
    workers: Workers, broker: Any
) -> None:
    """With `worker_cancel_long_running_tasks_on_connection_loss`, every step in flight was
    cancelled on the broker blip and ran again."""
    workers.start(concurrency=20, beat=True, AGENTFLOW_SWEEP_INTERVAL="1")
    run_ids = [durable.start(workflows.held.name) for _ in range(20)]
    wait_for(
        lambda: all(executions(run_id, "hold") for run_id in run_ids),
        timeout=60,
        what="20 effect steps in flight",
    )

    broker.restart()  # everything queued or unacknowledged is gone
    for run_id in run_ids:
        partner.release(run_id)

    for run_id in run_ids:
        wait_finished(run_id, timeout=60)
    statuses = WorkflowRun.objects.filter(pk__in=run_ids).values_list("status", flat=True)
    assert sorted(set(statuses)) == [RunStatus.COMPLETED]
    for run_id in run_ids:
        assert_completed_once(run_id)  # each step ran once: no step was cancelled and re-run
