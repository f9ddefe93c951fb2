"""`manage.py agentflow_builds [--json]`: every build, as current (this process's), draining (runs
still on it: keep its workers) or drained (none: safe to stop), with its live workers
(docs/deploys.md, "Builds").
"""

from __future__ import annotations

import json
from typing import Any

from agentflow._builds.roster import build_states
from agentflow._core import builds
from agentflow.management.base import BaseCommand


class Command(BaseCommand):
    help = "List builds: current, draining (with their runs) or drained (safe to stop)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, json: bool, **options: Any) -> None:
        rows = build_states()
        if json:
            self.stdout.write(_dumps({"build": builds.current(), "builds": rows}))
            return
        for row in rows:
            self.stdout.write(
                f"{row['build']}: {row['state']}, {len(row['live_workers'])} live workers, "
                f"{row['active_runs']} active runs ({len(row['pinned_runs'])} pinned, "
                f"{row['held_runs']} waiting for a worker)"
            )
            for run_id in row["pinned_runs"]:
                self.stdout.write(f"    {run_id}")


def _dumps(payload: dict[str, Any]) -> str:
    return json.dumps(payload)
