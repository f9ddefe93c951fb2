"""Portable raw SQL for the step hot path: the ORM costs ~0.5 ms of Python per statement.

Values go through the connection's own adapters, so the same statements run on Postgres and on
the embedded SQLite default.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from django.db import connection, transaction
from django.utils.dateparse import parse_datetime

from agentflow.models import RunEvent, StepCheckpoint, SweeperHeartbeat, WorkflowRun

RUNS = WorkflowRun._meta.db_table
STEPS = StepCheckpoint._meta.db_table
EVENTS = RunEvent._meta.db_table
HEARTBEATS = SweeperHeartbeat._meta.db_table


def now() -> str:
    """The database's clock as SQL: every time comparison is made with it, never with a
    worker's (SPEC 3.3). SQLite has no server, so there it is this host's clock, in the text
    form Django stores datetimes in."""
    if connection.vendor == "postgresql":
        return "now()"
    return "strftime('%Y-%m-%d %H:%M:%f', 'now')"


def now_plus() -> str:
    """The database's clock plus a parameter of seconds (a float), as SQL."""
    if connection.vendor == "postgresql":
        return "(now() + %s * interval '1 second')"
    return "strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.6f seconds', %s))"


def seconds_since(column: str) -> str:
    """Seconds from `column` to the database's clock, as SQL (a float)."""
    if connection.vendor == "postgresql":
        return f"EXTRACT(EPOCH FROM (now() - {column}))"
    return f"((julianday('now') - julianday({column})) * 86400.0)"


JSON_COLUMNS = frozenset({"input", "output", "compensations", "arguments"})


@contextmanager
def cursor() -> Iterator[Any]:
    """A cursor for the hot path; errors still surface as Django's (IntegrityError, ...).

    On Postgres it is psycopg's own server-binding cursor, not Django's client-binding one, so
    the hot path's handful of statement shapes become prepared statements (the connection's
    `prepare_threshold`, set in settings): planning a step write costs Postgres more than
    running it.
    """
    if connection.vendor != "postgresql":
        with connection.cursor() as django_cursor:
            yield django_cursor
        return
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as raw:
        yield raw


@dataclass(frozen=True)
class KeepIfLater:
    """Leave a timestamp column alone when it is already at least `threshold`, else set `value`.

    Re-arming `wake_at` only when it is close keeps most step updates of a moving run away from
    the indexed columns, so Postgres can make them HOT updates (no index writes at all).
    """

    threshold: datetime
    value: datetime


def set_clause(changes: Mapping[str, Any]) -> tuple[str, list[Any]]:
    """`col = %s, …` and its parameters, adapted for this connection."""
    parts, params = [], []
    for column, value in changes.items():
        if isinstance(value, KeepIfLater):
            parts.append(f"{column} = CASE WHEN {column} >= %s THEN {column} ELSE %s END")
            params += [adapt(column, value.threshold), adapt(column, value.value)]
        else:
            parts.append(f"{column} = %s")
            params.append(adapt(column, value))
    return ", ".join(parts), params


def adapt(column: str, value: Any) -> Any:
    if value is None:
        return None
    if column in JSON_COLUMNS:
        return connection.ops.adapt_json_value(value, None)
    if isinstance(value, datetime):
        return connection.ops.adapt_datetimefield_value(value)
    return value


def read_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


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


def update(table: str, changes: Mapping[str, Any], where: str, params: list[Any]) -> int:
    """UPDATE … SET changes WHERE where; the row count decides compare-and-set races."""
    assignments, values = set_clause(changes)
    with cursor() as cur:
        cur.execute(f"UPDATE {table} SET {assignments} WHERE {where}", [*values, *params])
        return cur.rowcount


def insert(table: str, values: Mapping[str, Any]) -> None:
    columns = ", ".join(values)
    params = [adapt(column, value) for column, value in values.items()]
    with cursor() as cur:
        cur.execute(f"INSERT INTO {table} ({columns}) VALUES ({placeholders(params)})", params)


def fetch_one(query: str, params: list[Any]) -> tuple[Any, ...] | None:
    with cursor() as cur:
        cur.execute(query, params)
        return cur.fetchone()


class _Rollback(Exception):
    pass


def move_run_and_step(
    *,
    run_id: str,
    seq: int,
    active: list[str],
    run_changes: Mapping[str, Any],
    step_insert: Mapping[str, Any] | None = None,
    step_fence: tuple[str, int] | None = None,
    step_changes: Mapping[str, Any] | None = None,
) -> bool:
    """Atomically update the run (fenced: still active and at `seq`) and either insert the
    step's checkpoint or update it (fenced on its (status, attempts)).

    Returns False, changing nothing, when a fence fails; raises IntegrityError when the insert
    loses to another worker's. On Postgres this is ONE statement, so one round trip and, outside
    a transaction, one commit; elsewhere it is a short transaction of two statements.
    """
    if connection.vendor == "postgresql":
        return _move_one_statement(
            run_id, seq, active, run_changes, step_insert, step_fence, step_changes
        )
    try:
        with transaction.atomic():
            if not update(
                RUNS,
                run_changes,
                f"id = %s AND current_seq = %s AND status IN ({placeholders(active)})",
                [run_id, seq, *active],
            ):
                raise _Rollback
            if step_insert is not None:
                insert(STEPS, step_insert)
            else:
                assert step_fence is not None and step_changes is not None
                if not update(
                    STEPS,
                    step_changes,
                    "run_id = %s AND seq = %s AND status = %s AND attempts = %s",
                    [run_id, seq, *step_fence],
                ):
                    raise _Rollback
    except _Rollback:
        return False
    return True


def _move_one_statement(
    run_id: str,
    seq: int,
    active: list[str],
    run_changes: Mapping[str, Any],
    step_insert: Mapping[str, Any] | None,
    step_fence: tuple[str, int] | None,
    step_changes: Mapping[str, Any] | None,
) -> bool:
    run_set, run_values = set_clause(run_changes)
    statuses = placeholders(active)
    if step_insert is not None:
        # NULLs are left to the column default: an untyped NULL in a SELECT list is text.
        values = {column: value for column, value in step_insert.items() if value is not None}
        query = f"""
            WITH moved AS (
                UPDATE {RUNS} SET {run_set}
                WHERE id = %s AND current_seq = %s AND status IN ({statuses})
                RETURNING id
            )
            INSERT INTO {STEPS} ({", ".join(values)})
            SELECT {placeholders(values)} FROM moved
        """
        params = [
            *run_values,
            run_id,
            seq,
            *active,
            *(adapt(column, value) for column, value in values.items()),
        ]
    else:
        assert step_fence is not None and step_changes is not None
        step_set, step_values = set_clause(step_changes)
        # `ok` locks both rows and checks both fences (re-checked after any lock wait), so the
        # two updates happen together or not at all.
        query = f"""
            WITH ok AS (
                SELECT c.id FROM {STEPS} c JOIN {RUNS} r ON r.id = c.run_id
                WHERE r.id = %s AND r.current_seq = %s AND r.status IN ({statuses})
                  AND c.seq = %s AND c.status = %s AND c.attempts = %s
                FOR UPDATE
            ), step AS (
                UPDATE {STEPS} SET {step_set} WHERE id IN (SELECT id FROM ok) RETURNING id
            )
            UPDATE {RUNS} SET {run_set} WHERE id = %s AND EXISTS (SELECT 1 FROM step)
        """
        params = [
            run_id,
            seq,
            *active,
            seq,
            *step_fence,
            *step_values,
            *run_values,
            run_id,
        ]
    with cursor() as cur:
        cur.execute(query, params)
        return cur.rowcount == 1
