"""Behind a real PgBouncer 1.18 in transaction mode (issue 20): prepared statements are lost
between clients, `AGENTFLOW_DB_PREPARED_STATEMENTS` decides what the engine does about it, and a
database error in a step is never what FAILs a run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import DatabaseError, ProgrammingError, connection, transaction

from agentflow import durable
from agentflow._base.states import RunStatus, StepStatus
from agentflow._core import leases, pooler
from agentflow._store import sql
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.testing.processes import PgBouncerServer
from agentflow.testing.waiting import wait_for
from tests.support import partner, workflows

pytestmark = pytest.mark.django_db(transaction=True)

#: psycopg's names count from _pg3_0 in every client, and PgBouncer hands an idle server
#: connection to the next client: the second client to prepare a statement finds the first
#: one's under the same name on the same server connection. Deterministic, no timing.
THRESHOLD = 5


@pytest.fixture
def lost_flag_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pooler, "_lost_in_process", False)


@pytest.fixture
def pgbouncer(tmp_path: Path) -> Iterator[PgBouncerServer]:
    """A PgBouncer of this test's own: server connections keep what earlier clients prepared
    (transaction mode runs no reset query), so a shared one would make the tests' order
    matter."""
    port = int(connection.settings_dict["PORT"] or 5432)
    with PgBouncerServer(tmp_path, upstream_port=port, pool_size=1) as server:
        yield server


@pytest.fixture
def through_pgbouncer(pgbouncer: PgBouncerServer, lost_flag_reset: None) -> Iterator[Any]:
    """This process's default connection goes through PgBouncer, as a worker's would, with
    the site's prepare threshold; `other` is a second client that prepares first."""
    db = connection.settings_dict
    saved = {key: db[key] for key in ("HOST", "PORT")}
    connection.close()
    db.update(HOST="127.0.0.1", PORT=str(pgbouncer.port))
    other = psycopg.connect(
        pgbouncer.url_for(db["NAME"]), autocommit=True, prepare_threshold=THRESHOLD
    )
    try:
        yield other
    finally:
        other.close()
        connection.close()
        db.update(saved)


def _statements(times: int = THRESHOLD + 2) -> None:
    """The store's cursor (what the hot path uses), one shape of statement `times` times."""
    for n in range(times):
        with sql.cursor() as cursor:
            cursor.execute("SELECT %s::int + 1", [n])
            assert cursor.fetchone() == (n + 1,)


def _prepared_by(other: psycopg.Connection) -> None:
    for n in range(THRESHOLD + 1):
        other.execute("SELECT %s::int + 1", (n,))


def test_pgbouncer_1_18__a_second_client_preparing_the_same_statement__already_exists(
    pgbouncer: PgBouncerServer,
) -> None:
    """The failure mode as psycopg meets it, without the engine in between."""
    assert pgbouncer.version()[:2] == (1, 18)
    first, second = (
        psycopg.connect(pgbouncer.url_for("postgres"), autocommit=True, prepare_threshold=THRESHOLD)
        for _ in range(2)
    )
    with first, second:
        _prepared_by(first)
        with pytest.raises(psycopg.errors.DuplicatePreparedStatement, match="_pg3_0"):
            _prepared_by(second)


def test_pgbouncer_1_18__a_name_another_client_prepared__runs_its_statement_with_our_values(
    pgbouncer: PgBouncerServer,
) -> None:
    """Why "auto" cannot wait for the first error: on one server connection (pool of one),
    client A's `_pg3_0` is replaced by client B's, and A's next execution answers B's query
    with A's values, without any error."""
    url = pgbouncer.url_for("postgres")
    with (
        psycopg.connect(url, autocommit=True, prepare_threshold=0) as a,
        psycopg.connect(url, autocommit=True, prepare_threshold=0) as b,
    ):
        assert a.execute("SELECT %s::int + 1000", (1,)).fetchone() == (1001,)  # _pg3_0
        b.execute("DEALLOCATE ALL", prepare=False)  # the same server connection, any client
        assert b.execute("SELECT %s::int * 0", (2,)).fetchone() == (0,)  # B's _pg3_0

        assert a.execute("SELECT %s::int + 1000", (3,)).fetchone() == (0,)  # B's query ran


def test_on__behind_pgbouncer_1_18__the_error_reaches_the_caller(
    through_pgbouncer: Any, settings: Any
) -> None:
    settings.AGENTFLOW_DB_PREPARED_STATEMENTS = "on"
    _prepared_by(through_pgbouncer)
    with pytest.raises(ProgrammingError, match="already exists"):
        _statements()


def test_auto__a_connection_pgbouncer_answers__prepares_nothing_from_the_start(
    through_pgbouncer: Any, settings: Any
) -> None:
    settings.AGENTFLOW_DB_PREPARED_STATEMENTS = "auto"
    _prepared_by(through_pgbouncer)

    _statements()

    assert connection.connection.prepare_threshold is None
    assert not pooler._lost_in_process  # known at connect, not found out from an error


def _lose_our_prepared_statements() -> None:
    """Behind psycopg's back, as a pooler would: the server forgets every prepared statement
    of this connection while psycopg still believes it has them (a real 26000 next)."""
    raw = connection.connection
    names = raw.execute("SELECT name FROM pg_prepared_statements", prepare=False).fetchall()
    assert names, "nothing was prepared"
    for (name,) in names:  # one by one: psycopg notices DEALLOCATE ALL and forgets them too
        raw.execute(f'DEALLOCATE "{name}"', prepare=False)


@pytest.mark.usefixtures("lost_flag_reset")
def test_auto__a_lost_statement_runs_again_unprepared__and_the_process_prepares_no_more(
    settings: Any,
) -> None:
    settings.AGENTFLOW_DB_PREPARED_STATEMENTS = "auto"
    connection.close()
    _statements()  # direct to Postgres: prepared
    assert connection.connection.prepare_threshold == THRESHOLD
    _lose_our_prepared_statements()

    _statements()  # the first lost its statement; run again, it answered

    assert connection.connection.prepare_threshold is None
    assert pooler._lost_in_process
    connection.close()
    connection.ensure_connection()
    assert connection.connection.prepare_threshold is None  # new connections start without
    connection.close()


@pytest.mark.usefixtures("lost_flag_reset")
def test_auto__a_statement_lost_inside_a_transaction__the_error_goes_up__once_more_it_succeeds(
    settings: Any,
) -> None:
    """The server aborted the transaction, so the statement cannot simply run again: whoever
    runs the transaction runs it again (the step task does, once), now unprepared."""
    settings.AGENTFLOW_DB_PREPARED_STATEMENTS = "auto"
    connection.close()
    _statements()
    _lose_our_prepared_statements()

    with pytest.raises(DatabaseError) as lost, transaction.atomic():
        _statements()
    assert pooler.lost_prepared_statement(lost.value)
    assert pooler.database_trouble(lost.value)

    with transaction.atomic():
        _statements()
    connection.close()


def test_off__nothing_is_prepared(through_pgbouncer: Any, settings: Any) -> None:
    settings.AGENTFLOW_DB_PREPARED_STATEMENTS = "off"
    connection.close()
    _prepared_by(through_pgbouncer)
    _statements()
    assert connection.connection.prepare_threshold is None
    assert not pooler._lost_in_process


# --- the pooler never decides a run's outcome ---------------------------------------------------
def _until_finished(drive: Callable[[str], WorkflowRun], run_id: str) -> WorkflowRun:
    """Drive the run, again after each (short) back-off, until it stops."""

    def finished() -> WorkflowRun | None:
        run = drive(run_id)
        return run if run.status not in (RunStatus.WAITING, RunStatus.RUNNING) else None

    return wait_for(finished, timeout=20, interval=0.05, what=f"run {run_id} to stop")


@pytest.mark.usefixtures("engine", "lost_flag_reset")
def test_a_lost_prepared_statement_in_a_read_and_after_an_effect__retried_under_the_same_key(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.pooled.name)

    run = _until_finished(drive, run_id)

    assert run.status == RunStatus.COMPLETED, run.error
    steps = {cp.name: cp for cp in StepCheckpoint.objects.filter(run_id=run_id)}
    assert {name: cp.attempts for name, cp in steps.items()} == {
        "lookup": 2,
        "charge": 2,
        "finish": 1,
    }
    key = durable.idempotency_key(run_id, steps["charge"].seq)
    assert partner.effects()[key] == 1  # the retry replayed the key: one effect
    assert partner.requests()[key] == 2


@pytest.mark.usefixtures("engine", "lost_flag_reset")
def test_the_database_failing_every_attempt__parked_outcome_unknown__never_failed(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.pooled_for_good.name)

    run = _until_finished(drive, run_id)

    assert run.status == RunStatus.NEEDS_ATTENTION
    assert "outcome unknown" in run.error and "the database kept failing" in run.error
    charge = StepCheckpoint.objects.get(run_id=run_id, seq=run.current_seq)
    assert charge.status == StepStatus.IN_PROGRESS  # may have happened: an operator decides
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.OUTCOME_UNKNOWN).exists()


@pytest.mark.usefixtures("engine", "lost_flag_reset")
def test_a_read_step_the_database_fails_every_time__parked_with_the_reason__never_failed(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.pooled_read_for_good.name)

    run = _until_finished(drive, run_id)

    assert run.status == RunStatus.NEEDS_ATTENTION
    assert run.error.startswith("lookup: the database kept failing (gave up after 3 attempts")


def test_liveness_through_the_pooler__refused__leases_alone(
    pgbouncer: PgBouncerServer, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A session lock through a pooler in transaction mode would stay on a server connection
    that outlives its worker, or vanish with one PgBouncer closes while the worker lives."""
    settings.AGENTFLOW_LIVENESS_DATABASE_URL = pgbouncer.url_for(connection.settings_dict["NAME"])
    leases.release()

    _token, key, server = leases.current_owner()

    assert key is None and server == ""  # no lock: its claims are left to their leases
    assert "reached Postgres through a pooler" in caplog.text
    leases.release()
