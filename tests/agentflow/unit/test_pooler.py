"""Which database errors are the database's or a pooler's (retried, never a step's failure),
and the prepared-statement setting's values."""

from __future__ import annotations

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DataError, IntegrityError, OperationalError, ProgrammingError
from django.db.utils import InternalError

from agentflow._core import pooler


def wrapped(django_class: type[Exception], cause: psycopg.Error) -> Exception:
    """As Django raises it: its own class, psycopg's error as the cause."""
    exc = django_class(str(cause))
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(
    "exc",
    [
        wrapped(ProgrammingError, psycopg.errors.InvalidSqlStatementName("lost")),  # 26000
        wrapped(ProgrammingError, psycopg.errors.DuplicatePreparedStatement("taken")),  # 42P05
        wrapped(OperationalError, psycopg.errors.SerializationFailure("retry")),  # 40001
        wrapped(OperationalError, psycopg.errors.DeadlockDetected("retry")),  # 40P01
        wrapped(OperationalError, psycopg.errors.AdminShutdown("restart")),  # 57P01
        wrapped(OperationalError, psycopg.errors.ProtocolViolation("pooler")),  # 08P01
        wrapped(InternalError, psycopg.errors.InFailedSqlTransaction("aborted")),  # 25P02
        OperationalError("server closed the connection unexpectedly"),  # no SQLSTATE at all
    ],
    ids=lambda exc: pooler.sqlstate(exc) or type(exc).__name__,
)
def test_database_trouble__the_database_s_or_a_pooler_s_errors(exc: Exception) -> None:
    assert pooler.database_trouble(exc)


@pytest.mark.parametrize(
    "exc",
    [
        wrapped(IntegrityError, psycopg.errors.UniqueViolation("dup")),  # the code's write
        wrapped(ProgrammingError, psycopg.errors.UndefinedTable("typo")),  # the code's SQL
        wrapped(DataError, psycopg.errors.NumericValueOutOfRange("big")),
        ValueError("not a database error"),
    ],
    ids=lambda exc: pooler.sqlstate(exc) or type(exc).__name__,
)
def test_database_trouble__the_code_s_own_errors_are_not(exc: Exception) -> None:
    assert not pooler.database_trouble(exc)


def test_lost_prepared_statement__only_26000_and_42p05() -> None:
    assert pooler.lost_prepared_statement(
        wrapped(ProgrammingError, psycopg.errors.InvalidSqlStatementName("lost"))
    )
    assert not pooler.lost_prepared_statement(
        wrapped(OperationalError, psycopg.errors.SerializationFailure("retry"))
    )


def test_mode__auto_on_off__anything_else_refused(settings: object) -> None:
    for value in ("auto", "on", "OFF "):
        settings.AGENTFLOW_DB_PREPARED_STATEMENTS = value  # type: ignore[attr-defined]
        assert pooler.mode() == value.strip().lower()
    settings.AGENTFLOW_DB_PREPARED_STATEMENTS = "sometimes"  # type: ignore[attr-defined]
    with pytest.raises(ImproperlyConfigured, match="auto, on, off"):
        pooler.mode()
