"""The database server crashes and comes back (docs/figures/chaos.md, "Database restarts", issue 8):
on a private PostgreSQL, never the machine's shared one.

The server really restarts (a new postmaster, crash recovery, committed rows still there); a
worker whose pooled connection died with it goes on without waiting for the sweeper; and a
small chaos run with one database restart loses nothing and doubles nothing.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connections

from agentflow import durable
from agentflow._base.states import RunStatus, StepStatus
from agentflow._recovery import sweeper
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow.testing.processes import PgBouncerServer, PostgresServer, ProcessStartError
from agentflow.testing.waiting import wait_for
from tests.agentflow.acceptance.test_engine_crashes import (
    assert_completed_once,
    wait_execution,
    wait_finished,
)
from tests.support import partner, workflows
from tests.support.processes import INFRA, Workers

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def postgres(tmp_path: Path) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path, dbname="restart")
    try:
        server.start()
    except ProcessStartError as exc:
        server.stop()
        pytest.skip(f"no private PostgreSQL here: {exc}")
    yield server
    server.stop()


def test_private_postgres__restart_is_a_new_postmaster_after_crash_recovery_with_rows_kept(
    postgres: PostgresServer,
) -> None:
    with postgres.connect() as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (1), (2)")
    held = postgres.connect()
    before = postgres.postmaster_pid

    postgres.restart()

    assert postgres.postmaster_pid != before
    with pytest.raises(psycopg.OperationalError):
        held.execute("SELECT 1")  # every connection of the old server is gone
    with postgres.connect() as conn:
        assert conn.execute("SELECT n FROM kept ORDER BY n").fetchall() == [(1,), (2,)]
    log = postgres.log_path.read_text()
    assert "database system was not properly shut down; automatic recovery in progress" in log


@pytest.mark.parametrize("infra", INFRA, indirect=True)
def test_worker__a_step_after_a_database_restart_runs_without_the_sweeper(
    postgres: PostgresServer, workers: Workers, infra: str, tmp_path: Path
) -> None:
    """The worker's pooled connection died with the server. Its next step must reconnect
    instead of failing on it: the message would be dropped and, with no sweeper running here,
    the run would never move again. Through PgBouncer the worker's own connection lives on;
    the server connection behind it is the one that died."""
    database = {"DATABASE_URL": postgres.url}
    if infra == "pgbouncer":
        bouncer = PgBouncerServer(tmp_path / "pgbouncer", upstream_port=postgres.port, pool_size=1)
        bouncer.start()
        database = {
            "DATABASE_URL": bouncer.url_for(postgres.dbname),
            "AGENTFLOW_LIVENESS_DATABASE_URL": postgres.url,
        }
    with postgres.serving_django():
        call_command("migrate", verbosity=0, interactive=False)
        workers.start(**database)  # no beat: no sweeper
        first = durable.start(workflows.chain.name)
        wait_finished(first)  # the worker's connection is now open, and pooled

        postgres.restart()
        connections.close_all()  # ours died too
        second = durable.start(workflows.chain.name)

        wait_finished(second, timeout=20)
        assert_completed_once(second)
    if infra == "pgbouncer":
        workers.kill_all()
        bouncer.stop()


def _keep_the_log_in_memory(postgres: PostgresServer) -> None:
    """Stop the server's WAL writer and background writer: a commit that does not wait for the
    disk then stays in the server's memory, so a crash loses exactly those commits (with
    everything after them), deterministically."""
    with postgres.connect() as conn:
        writers = [
            pid
            for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity"
                " WHERE backend_type IN ('walwriter', 'background writer')"
            )
        ]
    assert len(writers) == 2
    for pid in writers:
        os.kill(pid, signal.SIGSTOP)


def test_crash__a_completion_lost_with_the_server_is_made_again_and_its_effect_stays_once(
    postgres: PostgresServer, workers: Workers
) -> None:
    """A step's completion commits without waiting for the disk (sql.RELAXED_COMMIT); its
    claim waits. With the log kept in memory, a crash loses the commits that did not wait:
    here the charge's completion, while the charge's claim, and the read before it that the
    claim's wait flushed, survive. The run then finds the charge's claim without a live owner,
    takes it over, and the partner's key keeps its effect to one. The read after the charge
    holds the run unfinished: the completion that ends a run waits (the test below)."""
    with postgres.serving_django():
        call_command("migrate", verbosity=0, interactive=False)
        _keep_the_log_in_memory(postgres)
        first = workers.start(DATABASE_URL=postgres.url)  # no beat: no sweeper
        run_id = durable.start(workflows.lingering.name)
        wait_execution(run_id, "linger")  # the charge's completion published it
        assert partner.effects()[durable.idempotency_key(run_id, 2)] == 1
        workers.kill_all()
        assert not first.alive()

        postgres.restart()
        connections.close_all()

        run = WorkflowRun.objects.get(pk=run_id)
        steps = {cp.name: cp.status for cp in StepCheckpoint.objects.filter(run_id=run_id)}
        assert (run.status, run.current_seq) == (RunStatus.RUNNING, 2)
        assert steps == {"prepare": StepStatus.COMPLETED, "charge": StepStatus.IN_PROGRESS}

        partner.release(run_id)
        workers.start(
            beat=True,
            DATABASE_URL=postgres.url,
            AGENTFLOW_LEASE_SECONDS="2",
            AGENTFLOW_SWEEP_INTERVAL="1",
        )
        wait_finished(run_id, timeout=30)
        assert_completed_once(run_id, reexecuted={"charge": 2}, reads_may_repeat=True)


@pytest.mark.parametrize(
    ("flow", "ended"),
    [(workflows.chain, RunStatus.COMPLETED), (workflows.undo, RunStatus.FAILED)],
    ids=["completed", "failed"],
)
def test_crash__a_run_seen_finished_stays_finished(
    postgres: PostgresServer, workers: Workers, flow: durable.Workflow, ended: str
) -> None:
    """The completion that ends a run is the one the outside acts on (the status page says
    done, `durable.snapshot` says finished, the metrics count it), and no later commit of the
    run would flush it: it waits for the disk. With the log kept in memory, a crash right after
    the run is seen finished finds it finished still, as it was seen; its last step (a read,
    or, after a failure, the notice) is not made again."""
    with postgres.serving_django():
        call_command("migrate", verbosity=0, interactive=False)
        _keep_the_log_in_memory(postgres)
        workers.start(DATABASE_URL=postgres.url)  # no beat: no sweeper
        run_id = durable.start(flow.name)
        wait_finished(run_id)
        seen = durable.snapshot(run_id)
        assert seen is not None and seen.status == ended
        workers.kill_all()

        postgres.restart()
        connections.close_all()

        after = durable.snapshot(run_id)
        assert after is not None
        assert (after.status, after.output, after.steps) == (seen.status, seen.output, seen.steps)


def test_liveness__a_backend_crash_frees_every_lock__a_live_owner_keeps_its_step(
    postgres: PostgresServer, workers: Workers
) -> None:
    """When any one server process crashes (the OOM killer), the postmaster resets every session
    and every advisory lock is freed, while pg_postmaster_start_time() stays. A claim made before
    that says nothing by its free lock ("cannot tell" is never "dead",
    docs/protocol.md, "Liveness"): the sweeper leaves a live owner's step to its lease. The owner is
    paused here, so it cannot take its lock again before the sweep looks."""
    with postgres.serving_django():
        call_command("migrate", verbosity=0, interactive=False)
        owner = workers.start(DATABASE_URL=postgres.url, AGENTFLOW_LEASE_SECONDS="60")
        run_id = durable.start(workflows.held.name)
        wait_execution(run_id, "hold")
        assert StepCheckpoint.objects.get(run_id=run_id, seq=2).lease_lock is not None
        workers.signal(owner, signal.SIGSTOP)
        with postgres.connect() as bystander:
            pid = bystander.execute("SELECT pg_backend_pid()").fetchone()[0]
            os.kill(pid, signal.SIGKILL)

        def reset() -> bool | None:
            try:
                with postgres.connect() as conn:
                    locks = conn.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    ).fetchone()
            except psycopg.OperationalError:
                return None  # still recovering
            return True if locks == (0,) else None

        wait_for(reset, timeout=30, what="the server's crash reset to free every lock")
        connections.close_all()

        assert run_id not in sweeper.sweep().requeued
        held = StepCheckpoint.objects.get(run_id=run_id, seq=2)
        assert (held.status, held.attempts) == (StepStatus.IN_PROGRESS, 1)

        workers.signal(owner, signal.SIGCONT)
        partner.release(run_id)
        wait_finished(run_id, timeout=30)
        assert_completed_once(run_id)


def test_chaos__one_postgres_restart_loses_nothing_and_doubles_nothing() -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("chaos starts its own redis-server, which is not installed")
    out = io.StringIO()
    call_command(
        "chaos",
        "--refunds",
        "8",
        "--seed",
        "5",
        "--postgres-restarts",
        "1",
        "--child-kills",
        "0",
        "--worker-kills",
        "0",
        "--no-broker-restart",
        "--double-submits",
        "1",
        "--timeout",
        "60",
        "--json",
        stdout=out,
        stderr=io.StringIO(),
    )
    report: dict[str, Any] = json.loads(out.getvalue())

    assert report["kills"]["postgres_restarts"] == 1
    assert report["kills"]["log"][0]["kind"] == "postgres"
    assert report["kills"]["log"][0]["in_progress_steps"], "the restart hit no step in flight"
    assert (report["runs"], report["completed"], report["stuck"]) == (8, 8, 0)
    assert report["submission_errors"] == []
    assert report["payments_per_refund"] == {"min": 1, "max": 1, "histogram": {"1": 8}}
    assert all(d == {"keys": 0, "refunds": 0} for d in report["duplicate_effects"].values())
    assert report["recovery_seconds"]["unrecovered"] == 0
    assert report["invariants"] == dict.fromkeys(("I1", "I2", "I3", "I4", "I7", "I8"), True)
