"""`manage.py bench_admin [--json]`: the operator's pages against a million-run history."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError
from django.db import connection

from agentflow.management.base import BaseCommand, whole
from config.bench.admin_scale import measure


class Command(BaseCommand):
    help = (
        "Time the run list (with its dashboard), filtered lists and a run page on a large "
        "history (inserted on first use and kept): the admin's cost must not follow history."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--history", type=whole(1), default=1_000_000, help="finished runs")
        parser.add_argument("--events", type=whole(0), default=1_000_000, help="old events")

    def handle(self, *args: Any, **options: Any) -> None:
        if connection.vendor != "postgresql":
            raise CommandError("bench_admin measures Postgres; set DATABASE_URL to one")
        report = measure(
            history=options["history"],
            events=options["events"],
            progress=lambda line: self.stderr.write(f"bench_admin: {line}"),
        )
        if options["json"]:
            self.stdout.write(json.dumps(report))
            return
        self.stdout.write(f"{report['runs']:,} runs, {report['events']:,} events")
        for page in report["pages"]:
            self.stdout.write(
                f"  {page['name']:<24} {page['ms']:>8.1f} ms  {page['queries']} queries"
            )
