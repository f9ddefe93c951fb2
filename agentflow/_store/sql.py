"""Portable raw SQL for the store: the ORM costs ~0.5 ms of Python per statement, and every
time comparison must use the database's clock, which the ORM cannot express.

Values go through the connection's own adapters, so the same statements run on Postgres and on
the embedded SQLite default. On SQLite there is no server clock: there it is this host's, which
is the only host an embedded database has.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from agentflow._core import leases, pooler
from agentflow._privacy import envelope, scope
from agentflow.models import (
    Build,
    BuildWorker,
    RunEvent,
    RunSignal,
    RunWait,
    StepCheckpoint,
    SweeperHeartbeat,
    WebhookReceipt,
    WorkflowRun,
)

RUNS = WorkflowRun._meta.db_table
STEPS = StepCheckpoint._meta.db_table
EVENTS = RunEvent._meta.db_table
HEARTBEATS = SweeperHeartbeat._meta.db_table
WAITS = RunWait._meta.db_table
SIGNALS = RunSignal._meta.db_table
RECEIPTS = WebhookReceipt._meta.db_table
BUILDS = Build._meta.db_table
WORKERS = BuildWorker._meta.db_table
JSON_COLUMNS = frozenset(
    {"input", "output", "compensations", "arguments", "data", "outcome", "payload", "definitions"}
)


# --- the database's clock -----------------------------------------------------------------------
def postgres() -> bool:
    """Is the default database Postgres? Asked a dozen times a step; the answer is the
    settings', read once (Django's connection proxy costs a thread-local lookup per access)."""
    return _vendor() == "postgresql"


@cache
def _vendor() -> str:
    return str(connections[DEFAULT_DB_ALIAS].vendor)


def databases_changed(*, setting: str, **kwargs: Any) -> None:
    """`setting_changed` receiver (connected in `apps.py`): a test that swaps DATABASES."""
    if setting == "DATABASES":
        _vendor.cache_clear()


def now() -> str:
    """The database's clock as SQL: every time comparison is made with it, never with a
    worker's (docs/protocol.md, "One step, in order"), so a host whose clock is off cannot decide
    anything."""
    if postgres():
        return "now()"
    return "strftime('%Y-%m-%d %H:%M:%f', 'now')"


def now_plus() -> str:
    """The database's clock plus a parameter of seconds (a float), as SQL."""
    if postgres():
        return "(now() + %s * interval '1 second')"
    return "strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', %s))"


def seconds_since(column: str) -> str:
    """Seconds from `column` to the database's clock, as SQL (a float)."""
    if postgres():
        return f"EXTRACT(EPOCH FROM (now() - {column}))"
    return f"((julianday('now') - julianday({column})) * 86400.0)"


def db_now() -> datetime:
    """The database's current time (on Postgres, the same value `now()` has for the rest of
    the transaction this runs in)."""
    if not postgres():
        return timezone.now()
    row = fetch_one("SELECT now()", [])
    assert row is not None
    return read_datetime(row[0])  # type: ignore[return-value]


def owner_gone(alias: str) -> str:
    """SQL, true when the checkpoint's owner process has provably lost its advisory lock
    (docs/protocol.md, "Liveness"): it died, on whatever host, or its liveness connection did. False
    without a lock to look at (SQLite, an owner that held none, a claim older than the server's last
    restart or crash of any of its processes, which freed every lock (`leases.LOCKS_SINCE_SQL`),
    or one made on another server: a promoted standby or a restored copy has every lock free):
    "cannot tell" is never "dead".

    Written as a CASE so the scan of `pg_locks` runs only when the answer depends on it."""
    if not postgres():
        return "(1 = 0)"
    # A lock freed by a restart or crash of the server says nothing of its owner: trust a free
    # lock only for a claim made since then (else the lease decides).
    return f"""(CASE WHEN {alias}.lease_lock IS NULL
                   OR {alias}.started_at <= {leases.LOCKS_SINCE_SQL}
                   OR {alias}.lease_server <> {leases.SERVER_SQL} THEN false
              ELSE NOT EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid::bigint = ({alias}.lease_lock >> 32)
          AND l.objid::bigint = ({alias}.lease_lock & 4294967295)) END)"""


def claimable(alias: str) -> str:
    """SQL, true when the checkpoint may be claimed now
    (docs/protocol.md, "One step, in order", step 4): a retryable FAILED attempt whose retry time
    has come, or an IN_PROGRESS one whose lease ran out or whose owner is gone. Decided with the
    database's clock at the moment of the write, so a renewal that committed after the caller's read
    is never overwritten."""
    n = now()
    return f"""(CASE
        WHEN {alias}.status = 'FAILED' THEN
            {alias}.retryable AND ({alias}.retry_at IS NULL OR {alias}.retry_at <= {n})
        WHEN {alias}.status = 'IN_PROGRESS' THEN
            (CASE WHEN {alias}.lease_expires_at <= {n} THEN true ELSE {owner_gone(alias)} END)
        ELSE false END)"""


# --- statements ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Expr:
    """A value written as SQL (the database's clock, a CASE) instead of a parameter."""

    sql: str
    params: tuple[Any, ...] = ()


def at_now() -> Expr:
    return Expr(now())


def at_now_plus(seconds: float) -> Expr:
    return Expr(now_plus(), (float(seconds),))


def first_fence(run_id: str) -> Expr:
    """The fence of a checkpoint about to be inserted: above every fence of the checkpoints a
    fork set aside at the same positions (the run's `fence_floor`), never 1 again."""
    return Expr(f"(SELECT fence_floor + 1 FROM {RUNS} WHERE id = %s)", (run_id,))


def keep_if_later(column: str, *, threshold_seconds: float, seconds: float) -> Expr:
    """Leave `column` alone when it is already at least now + `threshold_seconds`, else set it
    to now + `seconds`. Re-arming `wake_at` only when it is close keeps most step updates of a
    moving run away from the indexed column, so Postgres can make them HOT (no index writes)."""
    return Expr(
        f"CASE WHEN {column} >= {now_plus()} THEN {column} ELSE {now_plus()} END",
        (float(threshold_seconds), float(seconds)),
    )


def keep_if_near(column: str, *, threshold_seconds: float, seconds: float) -> Expr:
    """`keep_if_later`, but a `column` further on than now + `seconds` is pulled back to it: a
    run the sweeper left alone for a long back-off (docs/how-it-works.md) is due a lease after
    a worker moves it again, as any moving run is."""
    return Expr(
        f"CASE WHEN {column} >= {now_plus()} AND {column} <= {now_plus()} THEN {column} "
        f"ELSE {now_plus()} END",
        (float(threshold_seconds), float(seconds), float(seconds)),
    )


@contextmanager
def cursor() -> Iterator[Any]:
    """A cursor for the store; errors still surface as Django's (IntegrityError, ...).

    On Postgres it is psycopg's own server-binding cursor, not Django's client-binding one, so
    the hot path's handful of statement shapes become prepared statements (the connection's
    `prepare_threshold`, set in settings): planning a step write costs Postgres more than
    running it.
    """
    wrapper = connections[DEFAULT_DB_ALIAS]  # one thread-local lookup, not one per attribute
    if not postgres():
        with wrapper.cursor() as django_cursor:
            yield django_cursor
        return
    wrapper.ensure_connection()
    with wrapper.wrap_database_errors, pooler.Cursor(wrapper.connection) as raw:
        yield raw


def set_clause(changes: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """`col = %s, …` and its parameters, adapted for this connection."""
    parts, params = [], []
    for column, value in changes.items():
        sql, values = value_sql(column, value)
        parts.append(f"{column} = {sql}")
        params += values
    return ", ".join(parts), params


def value_sql(column: str, value: Any) -> tuple[str, list[Any]]:
    if isinstance(value, Expr):
        return value.sql, list(value.params)
    return "%s", [adapt(column, value)]


def adapt(column: str, value: Any) -> Any:
    if value is None:
        return None
    if column in JSON_COLUMNS:
        # A run's personal fields are sealed here, as they become a column (docs/privacy.md).
        return connection.ops.adapt_json_value(scope.seal_stored(value), None)
    if isinstance(value, datetime):
        return connection.ops.adapt_datetimefield_value(value)
    return value


def read_json(value: Any) -> Any:
    found = json.loads(value) if isinstance(value, str | bytes) else value
    return _opened(found) if _sealed(value) else found


def read_json_many(values: Sequence[Any]) -> list[Any]:
    """`read_json` of each value (None: SQL NULL), the texts parsed as one JSON array: one
    parse of a row's small values costs more in the call than in the parse."""
    texts = ["null" if value is None else value for value in values]
    if all(type(text) is str for text in texts):
        found = json.loads(f"[{','.join(texts)}]")
        return _opened(found) if any(map(_sealed, texts)) else found  # type: ignore[no-any-return]
    return [read_json(value) for value in values]


def _sealed(value: Any) -> bool:
    """Whether a stored JSON value may hold a sealed personal field (docs/privacy.md)."""
    if isinstance(value, str | bytes):
        return envelope.maybe_sealed(value)
    return value is not None and not isinstance(value, int | float | bool)


def _opened(value: Any) -> Any:
    return envelope.open_value(value)


def read_datetime(value: Any) -> datetime | None:
    """SQLite hands back naive UTC (a datetime through Django's converters, or text);
    Postgres hands back aware datetimes."""
    if value is None:
        return None
    parsed = value if isinstance(value, datetime) else parse_datetime(value)
    if parsed is not None and parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def placeholders(values: Iterable[Any]) -> str:
    return ", ".join("%s" for _ in values)


def execute(query: str, params: Sequence[Any]) -> int:
    """Run one statement; its row count decides compare-and-set races."""
    with cursor() as cur:
        cur.execute(query, list(params))
        return cur.rowcount


def update(table: str, changes: Mapping[str, Any], where: str, params: Sequence[Any]) -> int:
    """UPDATE … SET changes WHERE where; the row count decides compare-and-set races."""
    assignments, values = set_clause(changes)
    return execute(f"UPDATE {table} SET {assignments} WHERE {where}", [*values, *params])


def insert(table: str, values: Mapping[str, Any]) -> None:
    # A row of one run written outside its worker (an operator's decision, a signal): sealed
    # as that run's fields are (docs/privacy.md).
    with scope.run_scope_for(values.get("run_id")):
        columns, exprs, params = _insert_parts(values)
    execute(f"INSERT INTO {table} ({columns}) VALUES ({exprs})", params)


def _insert_parts(values: Mapping[str, Any]) -> tuple[str, str, list[Any]]:
    exprs, params = [], []
    for column, value in values.items():
        sql, found = value_sql(column, value)
        exprs.append(sql)
        params += found
    return ", ".join(values), ", ".join(exprs), params


def fetch_one(query: str, params: Sequence[Any]) -> tuple[Any, ...] | None:
    with cursor() as cur:
        cur.execute(query, list(params))
        return cur.fetchone()


def server_setting(name: str) -> str | None:
    """A Postgres setting as this connection's session sees it (None on another database)."""
    if not postgres():
        return None
    row = fetch_one("SELECT current_setting(%s)", [name])
    return str(row[0]) if row else None


def fetch_all(query: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with cursor() as cur:
        cur.execute(query, list(params))
        return list(cur.fetchall())


# --- one run and its step, moved together -------------------------------------------------------
#: A CTE that turns off `synchronous_commit` for the statement's own transaction (read at its
#: commit). Why a completion may skip the wait for the disk: a server crash can then lose it
#: (never half of it, and never anything committed after it: the log is replayed in order), but
#: nothing outside the database acts on a completion before a later commit that does wait — the
#: next effect's claim, an operator's action — and that commit flushes the log through it. A
#: completion lost in a crash is one the run makes again: a read runs again, an effect's claim
#: (committed with the wait) is taken over and reconciled, as after a worker crash at
#: `after_effect`. Not the completion that ends the run: no commit of the run comes after it,
#: and the outside acts on it (the status page says done, `durable.snapshot` says finished).
RELAXED_COMMIT = "relaxed AS (SELECT set_config('synchronous_commit', 'off', true))"


class _Rollback(Exception):
    pass


@dataclass(frozen=True)
class StepWhere:
    """The fence of a checkpoint update: SQL over the checkpoint's alias (`{c}`) + parameters."""

    sql: str
    params: tuple[Any, ...] = ()

    def render(self, alias: str) -> str:
        return self.sql.format(c=alias)


def move_run_and_step(
    *,
    run_id: str,
    seq: int,
    active: Sequence[str],
    run_changes: Mapping[str, Any],
    step_insert: Mapping[str, Any] | None = None,
    step_where: StepWhere | None = None,
    step_changes: Mapping[str, Any] | None = None,
    run_expected: Mapping[str, Any] | None = None,
    returning: Sequence[str] = (),
    synchronous: bool = True,
) -> tuple[Any, ...] | None:
    """Atomically update the run (fenced: still active and at `seq`, and its `run_expected`
    columns still as the caller read them) and either insert the step's checkpoint or update it
    (fenced by `step_where`).

    Returns None, changing nothing, when a fence fails, else a tuple of the checkpoint's
    `returning` columns as written; raises IntegrityError when the insert loses to another
    worker's. On Postgres this is ONE statement, so one round trip and, outside a transaction,
    one commit; elsewhere it is a short transaction of two or three statements.

    `synchronous=False`: a statement that is its own transaction commits without waiting for
    the log to reach the disk (see `RELAXED_COMMIT`); inside a caller's transaction it changes
    nothing, as that transaction's other writes may need the wait.
    """
    expected = run_expected or {}
    if postgres():
        relaxed = not synchronous and connection.get_autocommit() and not connection.in_atomic_block
        return _move_one_statement(
            run_id,
            seq,
            active,
            run_changes,
            step_insert,
            step_where,
            step_changes,
            expected,
            returning,
            relaxed,
        )
    expected_sql, expected_values = _expected(expected, "")
    run_fence = f"id = %s AND current_seq = %s AND status IN ({placeholders(active)})"
    try:
        with transaction.atomic():
            run_params = [run_id, seq, *active, *expected_values]
            if not update(RUNS, run_changes, run_fence + expected_sql, run_params):
                raise _Rollback
            if step_insert is not None:
                insert(STEPS, step_insert)
            else:
                assert step_where is not None and step_changes is not None
                where = f"run_id = %s AND seq = %s AND {step_where.render(STEPS)}"
                if not update(STEPS, step_changes, where, [run_id, seq, *step_where.params]):
                    raise _Rollback
            if not returning:
                return ()
            return fetch_one(
                f"SELECT {', '.join(returning)} FROM {STEPS} WHERE run_id = %s AND seq = %s",
                [run_id, seq],
            )
    except _Rollback:
        return None


def _expected(columns: Mapping[str, Any], prefix: str) -> tuple[str, list[Any]]:
    """` AND <prefix>column = %s …` for the run's columns a write expects, and the parameters."""
    where = "".join(f" AND {prefix}{column} = %s" for column in columns)
    return where, [adapt(column, value) for column, value in columns.items()]


def _move_one_statement(
    run_id: str,
    seq: int,
    active: Sequence[str],
    run_changes: Mapping[str, Any],
    step_insert: Mapping[str, Any] | None,
    step_where: StepWhere | None,
    step_changes: Mapping[str, Any] | None,
    expected: Mapping[str, Any],
    returning: Sequence[str],
    relaxed: bool,
) -> tuple[Any, ...] | None:
    run_set, run_values = set_clause(run_changes)
    statuses = placeholders(active)
    back = ", ".join(("id", *returning))
    outputs = ", ".join(f"(SELECT {column} FROM step)" for column in returning) or "1"
    # A CTE that is not data-modifying runs only when referenced: each shape below names it.
    relax, relax_used = (
        (f"{RELAXED_COMMIT}, ", " AND EXISTS (SELECT 1 FROM relaxed)") if relaxed else ("", "")
    )
    if step_insert is not None:
        # NULLs are left to the column default: an untyped NULL in a SELECT list is text.
        values = {column: value for column, value in step_insert.items() if value is not None}
        columns, exprs, insert_values = _insert_parts(values)
        expected_sql, expected_values = _expected(expected, "")
        query = f"""
            WITH {relax}moved AS (
                UPDATE {RUNS} SET {run_set}
                WHERE id = %s AND current_seq = %s AND status IN ({statuses})
                  {expected_sql}{relax_used}
                RETURNING id
            ), step AS (
                INSERT INTO {STEPS} ({columns})
                SELECT {exprs} FROM moved
                RETURNING {back}
            )
            SELECT {outputs} FROM step
        """
        params = [*run_values, run_id, seq, *active, *expected_values, *insert_values]
    else:
        assert step_where is not None and step_changes is not None
        step_set, step_values = set_clause(step_changes)
        expected_sql, expected_values = _expected(expected, "r.")
        # `ok` locks both rows and checks both fences (re-checked after any lock wait), so the
        # two updates happen together or not at all.
        query = f"""
            WITH {relax}ok AS (
                SELECT c.id FROM {STEPS} c JOIN {RUNS} r ON r.id = c.run_id
                WHERE r.id = %s AND r.current_seq = %s AND r.status IN ({statuses}){expected_sql}
                  AND c.seq = %s AND {step_where.render("c")}{relax_used}
                FOR UPDATE
            ), step AS (
                UPDATE {STEPS} SET {step_set} WHERE id IN (SELECT id FROM ok) RETURNING {back}
            )
            UPDATE {RUNS} SET {run_set} WHERE id = %s AND EXISTS (SELECT 1 FROM step)
            RETURNING {outputs}
        """
        params = [
            run_id,
            seq,
            *active,
            *expected_values,
            seq,
            *step_where.params,
            *step_values,
            *run_values,
            run_id,
        ]
    return fetch_one(query, params)
