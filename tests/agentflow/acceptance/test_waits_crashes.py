"""Waits survive everything with real processes (issue 18,
docs/workflows.md, "Timers, signals and approvals"): a run waiting for a signal or an approval
outlives a SIGKILL of its whole worker and a restart of a private PostgreSQL, and goes on, once,
when the signal or the decision comes; two signals with one id act once; a timer whose message died
with its worker is woken by the sweeper."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections

from agentflow import durable
from agentflow._base.states import RunStatus, StepKind, StepStatus
from agentflow.models import RunEvent, RunSignal, StepCheckpoint, WorkflowRun
from agentflow.testing.processes import PostgresServer, ProcessStartError
from agentflow.testing.waiting import wait_for
from tests.agentflow.acceptance.test_engine_crashes import wait_finished
from tests.support import partner, workflows
from tests.support.processes import Workers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path, dbname="waits")
    try:
        server.start()
    except ProcessStartError as exc:
        server.stop()
        pytest.skip(f"no private PostgreSQL here: {exc}")
    yield server
    server.stop()


def waiting_for(run_id: str, what: str) -> durable.RunSnapshot:
    def found() -> durable.RunSnapshot | None:
        run = durable.snapshot(run_id)
        return run if run is not None and run.waiting_for == what else None

    return wait_for(found, timeout=30, interval=0.05, what=f"run {run_id} to wait for {what}")


def assert_completed_once(run_id: str, *, waits: tuple[str, ...]) -> None:
    """COMPLETED; every step but the waits (which run no code) executed once; one effect per
    key at the partner."""
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    steps = list(StepCheckpoint.objects.filter(run_id=run_id).order_by("seq"))
    assert all(cp.status == StepStatus.COMPLETED for cp in steps)
    expected = {(run_id, cp.seq, cp.name): 1 for cp in steps if cp.name not in waits}
    assert dict(partner.execution_counts(run_id)) == expected
    keys = {cp.idempotency_key for cp in steps if cp.kind == StepKind.EFFECT}
    ours = {key: n for key, n in partner.effects().items() if key.startswith(f"{run_id}_")}
    assert ours == dict.fromkeys(keys, 1)


def killed_and_restarted(worker: object, postgres: PostgresServer, workers: Workers) -> None:
    """The whole worker SIGKILLed, then the database server crashed and restarted."""
    worker.kill()  # type: ignore[attr-defined]
    postgres.restart()
    connections.close_all()  # ours died with it


#: (workflow, input, the steps that wait and so run no code, the wait's position)
SIGNAL_WAITS = {
    "graph": (workflows.signalled, {}, ("reply",), 2),
    "agent": (workflows.waiting_agent, {"sleep": 0}, ("sleep", "wait_for:reply"), 3),
}


@pytest.mark.parametrize("engine_kind", SIGNAL_WAITS)
def test_signal_wait__survives_a_whole_worker_sigkill_and_a_postgres_restart__acts_once(
    postgres: PostgresServer, workers: Workers, engine_kind: str
) -> None:
    workflow, given, waits, position = SIGNAL_WAITS[engine_kind]
    with postgres.serving_django():
        call_command("migrate", verbosity=0, interactive=False)
        first = workers.start(DATABASE_URL=postgres.url)
        run_id = durable.start(workflow.name, input=given)
        waiting_for(run_id, "signal")

        killed_and_restarted(first, postgres, workers)
        assert durable.snapshot(run_id).waiting_for == "signal"  # type: ignore[union-attr]
        # Delivered with no worker up: recorded, the message waits on the broker.
        assert durable.signal(run_id, "reply", {"text": "yes"}, signal_id="sms-7") == "delivered"
        assert durable.signal(run_id, "reply", {"text": "yes"}, signal_id="sms-7") == "duplicate"
        workers.start(DATABASE_URL=postgres.url, beat=True)
        wait_finished(run_id)

        assert_completed_once(run_id, waits=waits)
        reply = StepCheckpoint.objects.get(run_id=run_id, seq=position)
        assert (reply.name, reply.output) == (waits[-1], {"payload": {"text": "yes"}})
        assert RunSignal.objects.filter(run_id=run_id).count() == 1
        assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SIGNAL).count() == 1


#: (workflow, input, the run's checkpoints once done, those that record no execution at the
#: partner (model turns)); the charge is at 2 in both
APPROVAL_WAITS = {
    "graph": (workflows.approval, {"amount": 4500}, ["prepare", "charge", "finish"], ()),
    "agent": (workflows.cashier, {}, ["llm", "charge", "llm"], ("llm",)),
}


@pytest.mark.parametrize("engine_kind", APPROVAL_WAITS)
def test_approval_wait__survives_a_whole_worker_sigkill_and_a_postgres_restart__charges_once(
    postgres: PostgresServer, workers: Workers, engine_kind: str
) -> None:
    workflow, given, names, unrecorded = APPROVAL_WAITS[engine_kind]
    with postgres.serving_django():
        call_command("migrate", verbosity=0, interactive=False)
        first = workers.start(DATABASE_URL=postgres.url)
        run_id = durable.start(workflow.name, input=given)
        pending = waiting_for(run_id, "approval").pending_approval

        killed_and_restarted(first, postgres, workers)
        workers.start(DATABASE_URL=postgres.url, beat=True)
        after = durable.snapshot(run_id)
        assert after is not None and after.pending_approval == pending  # the same request
        durable.approve(run_id, actor="alice", reason="fee confirmed")
        wait_finished(run_id)

        assert_completed_once(run_id, waits=unrecorded)
        assert [cp.name for cp in StepCheckpoint.objects.filter(run_id=run_id)] == names
        assert partner.effects()[durable.idempotency_key(run_id, 2)] == 1


def test_timer__its_message_died_with_the_worker__the_sweeper_wakes_it(
    workers: Workers, broker: Any
) -> None:
    first = workers.start()
    run_id = durable.start(workflows.short_timer.name)
    waiting_for(run_id, "timer")
    # The countdown is in the worker's hands (fetched, unacked), not still in the queue, where
    # the next worker would simply find it without the sweeper.
    wait_for(
        lambda: broker.queue_length() == 0 and broker.client().hlen("unacked") == 1,
        what="the worker to hold the timer's countdown",
    )

    first.kill()  # with it the countdown message it held (Redis keeps it invisible for an hour)
    workers.start(beat=True, AGENTFLOW_SWEEP_INTERVAL="1")
    run = wait_finished(run_id, timeout=40)

    assert run.status == RunStatus.COMPLETED, run.error
    assert_completed_once(run_id, waits=("pause",))
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SWEEP_REQUEUE).exists()
