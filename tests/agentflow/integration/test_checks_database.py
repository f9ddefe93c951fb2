"""The database check on the real Postgres: claims must reach the disk before their effects."""

from __future__ import annotations

import pytest
from django.core import checks as django_checks
from django.db import connection

from agentflow._engine import checks


@pytest.mark.django_db
def test_synchronous_commit_off_for_the_workers_session__warns_w006() -> None:
    assert checks.durable_claims(databases=["default"]) == []
    assert checks.durable_claims() == []  # `check` without --database reads no database
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = off")  # as ALTER ROLE ... SET would
    try:
        [warning] = checks.durable_claims(databases=["default"])
        assert warning.id == "agentflow.W006" and "synchronous_commit = off" in warning.msg
        found = django_checks.run_checks(tags=[django_checks.Tags.database], databases=["default"])
        assert "agentflow.W006" in [message.id for message in found]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET synchronous_commit")
    assert checks.durable_claims(databases=["default"]) == []
