"""A database outage as one process meets it: said once at ERROR when the database stops
answering, once at WARNING when it answers again, never as a traceback per request, step or
sweep (docs/operating.md, "When the database is down").

Each process keeps its own account (web workers, a worker's pool children, beat, a command):
what one process saw, its own log says. The outage ends for a process when one of its
connections to the database opens again (`connected`, Django's `connection_created`, or a
liveness connection of its own).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TypeVar

import psycopg
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse

logger = logging.getLogger("agentflow.outage")  # the name hosts' LOGGING knows

#: What a 503 tells a client to wait before trying again: a restart or a failover takes
#: seconds to a minute, and a customer's browser or a script should not hammer it meanwhile.
RETRY_AFTER_SECONDS = 30

#: An administrator's shutdown, a crash shutdown, the server starting up or shutting down: the
#: server is there but will not answer (with class 08, the connection exceptions).
_NOT_ANSWERING = frozenset({"57P01", "57P02", "57P03"})


def unreachable(exc: BaseException) -> bool:
    """Is this the database not answering at all (stopped, restarting, cut off), rather than
    an answer it gave (a lock or statement timeout, a serialization failure, a constraint)?
    Postgres only: SQLite's "database is locked" is an answer too."""
    if isinstance(exc, psycopg.Error):
        cause: BaseException | None = exc
    elif isinstance(exc, OperationalError | InterfaceError):
        cause = exc.__cause__
        if cause is None and isinstance(exc, InterfaceError):
            return True  # Django's own "connection already closed": a connection that died
    else:
        return False
    if isinstance(cause, psycopg.InterfaceError):
        return True
    if not isinstance(cause, psycopg.OperationalError):
        return False
    state = cause.sqlstate or ""
    return not state or state.startswith("08") or state in _NOT_ANSWERING


@dataclass
class _Account:
    #: Since when (wall clock) this process finds the database unreachable; None while it
    #: answers.
    since: float | None = None
    #: When (monotonic) it last answered again after an outage this process saw.
    answered_at: float | None = None


_account = _Account()
_lock = threading.Lock()


def noticed(exc: BaseException, doing: str) -> None:
    """The database did not answer while this process was `doing` something: an ERROR line
    the first time in an outage, DEBUG lines after it (the outage is one event, not one per
    request, step or sweep)."""
    with _lock:
        first = _account.since is None
        if first:
            _account.since = time.time()
    if first:
        logger.error(
            "the database is unreachable (%s) while %s; this process keeps trying and says "
            "once more when it answers again",
            describe(exc),
            doing,
        )
    else:
        logger.debug("the database is still unreachable while %s (%s)", doing, describe(exc))


def connected(*args: object, **kwargs: object) -> None:
    """A connection of this process to the database opened: an outage it saw is over. Also
    Django's `connection_created` receiver (connected in `apps.py`)."""
    with _lock:
        since, _account.since = _account.since, None
        if since is not None:
            _account.answered_at = time.monotonic()
    if since is not None:
        logger.warning(
            "the database answers again; this process first found it unreachable %.1f s ago",
            max(time.time() - since, 0.0),
        )


def down() -> bool:
    """Does this process find the database unreachable now (until a connection opens)?"""
    return _account.since is not None


def answered_seconds_ago() -> float | None:
    """Seconds since the database answered this process again after an outage it saw; None
    if it saw none."""
    at = _account.answered_at
    return None if at is None else time.monotonic() - at


def describe(exc: BaseException) -> str:
    """The error in one line, without the server's multi-line detail."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


Answer = TypeVar("Answer", bound=HttpResponse)


def retry_later(response: Answer) -> Answer:
    """A 503 a page answers while the database is unreachable: `Retry-After`, and marked as
    logged, so Django's `django.request` logger does not write an ERROR line for each one
    (`noticed` said it once)."""
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    response["Cache-Control"] = "no-store"
    response._has_been_logged = True  # type: ignore[attr-defined]  # django.utils.log.log_response
    return response
