"""`manage.py purge --older-than 30d`: delete finished runs, as the retention beat task does."""

from __future__ import annotations

import argparse
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from agentflow import _store as store
from agentflow.management.base import BaseCommand

_AGE = re.compile(r"^\s*(?P<amount>[0-9]{1,15})\s*(?P<unit>[dhms])\s*$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}


def parse_age(text: str) -> timedelta:
    """'30d', '12h', '90m', '45s' as a timedelta; anything else is refused with the reason."""
    found = _AGE.match(text)
    if found is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an age: write a whole number and a unit, d (days), h (hours), "
            "m (minutes) or s (seconds), e.g. 30d"
        )
    amount = int(found["amount"])
    if amount == 0:
        raise argparse.ArgumentTypeError(
            "the age must be more than 0 (0 would delete every finished run up to now)"
        )
    try:
        age = timedelta(**{_UNITS[found["unit"]]: amount})
        datetime.now(UTC) - age  # the cutoff must be a date, not before year 1
    except OverflowError:
        raise argparse.ArgumentTypeError(f"{text!r} is too long ago to be a date") from None
    return age


def format_age(age: timedelta) -> str:
    """The shortest of '30d', '12h', '90m', '45s' that says `age` exactly."""
    seconds = int(age.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


class Command(BaseCommand):
    help = (
        "Delete finished workflow runs (completed, failed, cancelled) created and last changed "
        "longer ago than --older-than, with their step checkpoints and events, in transactions "
        "of at most 1,000 runs. Active runs and runs that need attention are never deleted. "
        "The beat task does the same every hour with AGENTFLOW_RETENTION_DAYS (default 30)."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--older-than",
            type=parse_age,
            required=True,
            metavar="AGE",
            help="e.g. 30d, 12h, 90m or 45s",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, older_than: timedelta, dry_run: bool, **options: Any) -> None:
        deleted = store.runs_purge(older_than=older_than, dry_run=dry_run)
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "dry_run": dry_run,
                        "older_than_seconds": older_than.total_seconds(),
                        "runs": deleted.runs,
                        "children": deleted.children,
                        "rows": deleted.rows,
                        "transactions": len(deleted.batches),
                        "largest_transaction_runs": max(deleted.batches, default=0),
                    }
                )
            )
            return
        verb = "would delete" if dry_run else "deleted"
        self.stdout.write(
            f"{verb} {deleted.describe()} (finished, older than {format_age(older_than)})"
        )
