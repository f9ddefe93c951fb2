"""The schedules' "now": the database's clock, the one every beat and sweeper shares, so two
processes on hosts whose clocks differ agree on which slots are due."""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from agentflow._core import faults


def now() -> datetime:
    frozen = faults.schedule_clock()  # tests only (AGENTFLOW_FAULTS=1)
    if frozen is not None:
        return frozen
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        value: datetime = cursor.fetchone()[0]
    return value
