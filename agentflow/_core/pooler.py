"""The engine behind a connection pooler: which database errors are the database's (never a
step's bug), and server-side prepared statements on, off, or off once the pooler loses one.

PgBouncer in transaction mode hands each transaction whichever server connection is free.
Before 1.21 (Debian 12 ships 1.18), or without `max_prepared_statements`, a statement psycopg
prepared on one server connection is missing on the next ("prepared statement "_pg3_3" does not
exist") or already there under another client's name ("... already exists"). Worse, a name
another client prepared on that server connection runs that client's statement with our values
and answers without an error. So "auto" prepares nothing on a connection a pooler answered;
"on" is for PgBouncer 1.21+ with `max_prepared_statements` (or no pooler). A statement whose
prepared statement was lost all the same (a pooler that passes the server's pid through) never
ran, so nothing of it needs undoing: it runs again unprepared, and the process prepares no more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Self

import psycopg
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, InterfaceError, OperationalError
from psycopg.pq import TransactionStatus

from agentflow._conf import settings

logger = logging.getLogger("agentflow.pooler")  # the name hosts' LOGGING knows

MODES = ("auto", "on", "off")
#: invalid_sql_statement_name, duplicate_prepared_statement: a pooler moved us to a server
#: connection that does not have our prepared statement, or has another client's.
LOST_PREPARED_STATEMENT = frozenset({"26000", "42P05"})
#: SQLSTATEs that say the database (or a pooler in front of it) failed the statement, not the
#: statement's author: connection lost (08), serialization failure or deadlock (40), resources
#: (53), operator intervention such as a shutdown or a cancel (57), the server's own I/O (58),
#: and an aborted or timed-out transaction (25P02, 25P03).
TROUBLE_CLASSES = frozenset({"08", "40", "53", "57", "58"})
TROUBLE_STATES = LOST_PREPARED_STATEMENT | {"25P02", "25P03", "55P03"}

#: Set once a connection of this process lost a prepared statement: every later connection
#: starts without them (the pooler in front will not change while the process lives).
_lost_in_process = False


def sqlstate(exc: BaseException) -> str:
    """The SQLSTATE of a database error, whether Django wrapped it or not ("" if none)."""
    for candidate in (exc, exc.__cause__, exc.__context__):
        state = getattr(candidate, "sqlstate", None)
        if state:
            return str(state)
    return ""


def database_trouble(exc: BaseException) -> bool:
    """Did the database or a pooler fail this statement (retry it), rather than the code that
    sent it (a bug)? A lost connection, a pooler's error, a serialization failure, a lost
    prepared statement. A constraint violation or bad SQL is the code's."""
    if isinstance(exc, OperationalError | InterfaceError):
        return True
    if not isinstance(exc, DatabaseError):
        return False
    state = sqlstate(exc)
    return state in TROUBLE_STATES or state[:2] in TROUBLE_CLASSES


def lost_prepared_statement(exc: BaseException) -> bool:
    return isinstance(exc, DatabaseError) and sqlstate(exc) in LOST_PREPARED_STATEMENT


def mode() -> str:
    value = str(settings.AGENTFLOW_DB_PREPARED_STATEMENTS).strip().lower()
    if value not in MODES:
        raise ImproperlyConfigured(
            f"AGENTFLOW_DB_PREPARED_STATEMENTS must be one of {', '.join(MODES)}, not {value!r}"
        )
    return value


def connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Signal receiver: apply the mode to each new Postgres connection. In "auto", a
    connection whose server is not the process it was told at connect (a pooler answered)
    prepares nothing: waiting for the first lost statement is too late, since a name another
    client prepared on that server connection can run that client's statement with our values
    (PgBouncer 1.18 in transaction mode does exactly that)."""
    if connection.vendor != "postgresql":
        return
    chosen = mode()
    if chosen == "off" or (chosen == "auto" and (_lost_in_process or _pooled(connection))):
        _unprepare(connection)
    if chosen == "auto" and _retry_unprepared not in connection.execute_wrappers:
        # First, so a caller's `execute_wrapper()` block, which pops the last one, keeps ours.
        connection.execute_wrappers.insert(0, _retry_unprepared)


class Cursor(psycopg.Cursor):
    """The store's server-binding cursor (agentflow._store.sql), which is what prepares: in
    "auto", a statement whose prepared statement the pooler lost runs once more, unprepared,
    when no transaction was open; inside one the error goes up (the server aborted it)."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Self:
        try:
            return super().execute(query, params, **kwargs)
        except psycopg.Error as exc:
            if sqlstate(exc) not in LOST_PREPARED_STATEMENT or mode() != "auto":
                raise
            forget_prepared_statements(self.connection)
            if self.connection.info.transaction_status != TransactionStatus.IDLE:
                raise
            return super().execute(query, params, **kwargs)


def _pooled(connection: Any) -> bool:
    """Is a pooler between us and Postgres? A pooler answers the startup itself, with a
    backend key of its own making, so the pid it reported is not the server process that runs
    our statements. One unprepared query per new connection."""
    raw = connection.connection
    with raw.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()", prepare=False)
        row = cursor.fetchone()
    pooled = row is not None and row[0] != raw.info.backend_pid
    if pooled:
        logger.info(
            "a pooler is between this process and Postgres (it reported backend pid %s, the "
            "server runs %s): no server-side prepared statements on this connection "
            "(AGENTFLOW_DB_PREPARED_STATEMENTS=on keeps them: PgBouncer 1.21+ with "
            "max_prepared_statements)",
            raw.info.backend_pid,
            row[0],
        )
    return pooled


def forget_prepared_statements(connection: Any) -> None:
    """A prepared statement went missing under a pooler: this process prepares no more.
    `connection`: Django's or psycopg's."""
    global _lost_in_process
    if not _lost_in_process:
        logger.warning(
            "a prepared statement was lost (a pooler in transaction mode without "
            "max_prepared_statements?): this process runs without server-side prepared "
            "statements from now on; AGENTFLOW_DB_PREPARED_STATEMENTS=off says so up front"
        )
    _lost_in_process = True
    _unprepare(connection)


def _unprepare(connection: Any) -> None:
    raw = connection if isinstance(connection, psycopg.Connection) else connection.connection
    if raw is not None:
        raw.prepare_threshold = None


def _retry_unprepared(
    execute: Callable[..., Any], sql: str, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    """Run the statement; if the pooler lost its prepared statement, stop preparing and run
    it once more. Inside a transaction the server has aborted it, so the error goes up to
    whoever retries the transaction (the step task runs its message again, once)."""
    try:
        return execute(sql, params, many, context)
    except DatabaseError as exc:
        if not lost_prepared_statement(exc):
            raise
        connection = context["connection"]
        forget_prepared_statements(connection)
        if connection.in_atomic_block:
            raise
        connection.errors_occurred = False  # the connection is fine; only the statement was lost
        return execute(sql, params, many, context)
