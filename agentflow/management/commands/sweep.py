"""`manage.py sweep`: one recovery pass, the same pass celery beat runs every tick."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError
from django.db import DatabaseError

from agentflow._core import outage
from agentflow._recovery import sweeper
from agentflow.management.base import BaseCommand, whole


class Command(BaseCommand):
    help = "Re-enqueue active workflow runs that stopped moving (one sweeper pass)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--limit", type=whole(1), default=None, help="most runs to re-enqueue")
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, limit: int | None, json: bool, **options: Any) -> None:
        try:
            report = sweeper.sweep(limit=limit)
        except DatabaseError as exc:
            if not outage.unreachable(exc):
                raise
            # One line and a non-zero exit, as beat's sweeper says it once in its log.
            raise CommandError(
                f"the database is unreachable ({outage.describe(exc)}); nothing was swept"
            ) from None
        if json:
            self.stdout.write(_dumps(report))
            return
        self.stdout.write(
            f"re-enqueued {len(report.requeued)}, parked {len(report.parked)}, "
            f"errors {len(report.errors)} (query {report.query_ms:.1f} ms)"
        )
        for error in report.errors:
            self.stderr.write(error)


def _dumps(report: sweeper.SweepReport) -> str:
    return json.dumps(
        {
            "requeued": report.requeued,
            "parked": report.parked,
            "errors": report.errors,
            "query_ms": round(report.query_ms, 3),
        }
    )
