"""A database outage as one process tells it: which errors are the database not answering, and
one ERROR line per outage, one WARNING when it answers again (no database here)."""

from __future__ import annotations

import logging
import sqlite3

import psycopg
import pytest
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse
from psycopg import errors

from agentflow._core import outage


def _wrapped(cause: Exception, kind: type[Exception] = OperationalError) -> Exception:
    """As Django raises it: its own class, the driver's error as the cause."""
    wrapped = kind(str(cause))
    wrapped.__cause__ = cause
    return wrapped


def _name(exc: Exception) -> str:
    cause = exc.__cause__
    return type(exc).__name__ + (f"<{type(cause).__name__}" if cause else "")


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError("connection failed: Connection refused"),  # no SQLSTATE
        errors.AdminShutdown("terminating connection due to administrator command"),  # 57P01
        errors.CannotConnectNow("the database system is starting up"),  # 57P03
        errors.ConnectionFailure("server closed the connection"),  # 08006
        psycopg.InterfaceError("the connection is closed"),
        _wrapped(psycopg.OperationalError("server closed the connection unexpectedly")),
        _wrapped(psycopg.InterfaceError("connection already closed"), InterfaceError),
        InterfaceError("connection already closed"),  # Django's own, no driver error behind
    ],
    ids=lambda exc: (
        type(exc).__name__ + (f"<{type(exc.__cause__).__name__}" if exc.__cause__ else "")
    ),
)
def test_unreachable__the_database_not_answering(exc: Exception) -> None:
    assert outage.unreachable(exc)


@pytest.mark.parametrize(
    "exc",
    [
        errors.LockNotAvailable("lock timeout"),  # 55P03: an answer, under load
        errors.QueryCanceled("canceling statement due to statement timeout"),  # 57014
        errors.SerializationFailure("could not serialize access"),  # 40001
        errors.UniqueViolation("duplicate key"),
        _wrapped(errors.LockNotAvailable("lock timeout")),
        _wrapped(sqlite3.OperationalError("database is locked")),  # SQLite answered
        ValueError("not a database error"),
    ],
    ids=lambda exc: (
        type(exc).__name__ + (f"<{type(exc.__cause__).__name__}" if exc.__cause__ else "")
    ),
)
def test_unreachable__not_an_answer_the_database_gave(exc: Exception) -> None:
    assert not outage.unreachable(exc)


def _outage_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "agentflow.outage"]


def test_noticed__one_error_per_outage_and_one_warning_when_it_answers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = psycopg.OperationalError("connection failed: Connection refused\nDETAIL: more")
    caplog.set_level(logging.INFO, logger="agentflow.outage")

    for _ in range(50):
        outage.noticed(refused, "answering a page")
    assert outage.down()
    outage.connected()
    outage.connected()  # more connections open: nothing more to say

    lines = _outage_lines(caplog)
    assert [level for level, _ in lines] == [logging.ERROR, logging.WARNING]
    assert lines[0][1].startswith(
        "the database is unreachable (OperationalError: connection failed: Connection refused) "
        "while answering a page;"
    )
    assert lines[1][1].startswith("the database answers again; this process first found it")
    assert not outage.down()
    back = outage.answered_seconds_ago()
    assert back is not None and back >= 0


def test_noticed__a_second_outage_is_told_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="agentflow.outage")
    refused = psycopg.OperationalError("Connection refused")

    for _ in range(2):
        outage.noticed(refused, "sweeping")
        outage.noticed(refused, "sweeping")
        outage.connected()

    levels = [level for level, _ in _outage_lines(caplog)]
    assert levels == [logging.ERROR, logging.WARNING, logging.ERROR, logging.WARNING]


def test_connected__without_an_outage_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="agentflow.outage")

    outage.connected()

    assert _outage_lines(caplog) == []
    assert outage.answered_seconds_ago() is None


def test_retry_later__a_503_django_does_not_log_again() -> None:
    response = outage.retry_later(HttpResponse(status=503))

    assert response["Retry-After"] == str(outage.RETRY_AFTER_SECONDS)
    assert response["Cache-Control"] == "no-store"
    assert response._has_been_logged  # type: ignore[attr-defined]  # django.utils.log
