"""Which database a step message's run lives in, as its publisher stamps it: a worker that takes
a message for a run its own database does not know can tell another deployment's message
(two deployments on one broker database and queue: docs/operating.md, "Two deployments on one
broker") from a run deleted here.

A database is named by the server itself, not by settings two deployments may share ("db:5432/
app" in two stacks): on Postgres its name and the cluster's system identifier, which initdb
draws at random; on SQLite its file.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from django.db import connection, transaction

logger = logging.getLogger("agentflow.origin")  # the name hosts' LOGGING knows

#: The step message header that carries the publisher's database.
HEADER = "agentflow_origin"

_POSTGRES_SQL = (
    "SELECT current_database() || '@' || (SELECT system_identifier FROM pg_control_system())"
)

#: A name that could not be read is asked for again after this long, not at every publish.
RETRY_SECONDS = 60.0

#: By the connection settings it was read through (tests switch databases).
_known: dict[tuple[Any, ...], str] = {}
_failed_at: dict[tuple[Any, ...], float] = {}


def database() -> str:
    """This process's database, as step messages carry it; "" when it cannot be read (its
    messages then go unstamped). One query per process and database."""
    db = connection.settings_dict
    source = (connection.vendor, db.get("NAME"), db.get("HOST"), db.get("PORT"))
    found = _known.get(source)
    if found is not None:
        return found
    failed = _failed_at.get(source)
    if failed is not None and time.monotonic() - failed < RETRY_SECONDS:
        return ""
    found = _read()
    if found:
        _known[source] = found
    else:
        _failed_at[source] = time.monotonic()
    return found


def _read() -> str:
    if connection.vendor == "sqlite":
        return f"sqlite:{os.path.realpath(str(connection.settings_dict.get('NAME') or ''))}"
    if connection.vendor != "postgresql":
        return ""
    try:
        # A savepoint when a transaction is open: a refusal must not spoil the caller's.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_POSTGRES_SQL)
            row = cursor.fetchone()
    except Exception as exc:  # a stamp is a courtesy: never a reason not to publish
        logger.debug("step messages go unstamped: this database's name cannot be read (%s)", exc)
        return ""
    return str(row[0]) if row and row[0] else ""


def of(request: Any) -> str | None:
    """The database a step message's publisher stamped (Celery puts message headers on the
    task's request); None for a message that carries none (an older publisher)."""
    value = getattr(request, HEADER, None)
    if value is None and isinstance(getattr(request, "headers", None), dict):
        value = request.headers.get(HEADER)
    return str(value) if value else None
