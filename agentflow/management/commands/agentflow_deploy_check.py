"""`manage.py agentflow_deploy_check [--json]`: before a deploy, with the new code, against the live
database: what this build would do with every run not finished (docs/deploys.md, "Builds").

Read-only: one read-only transaction, no partner call, no model request (an agent run's check is
a dry replay). Each run's decision is exactly the one `agentflow._builds.routing` takes at its next
step:
`upgrade` (this build takes it), `pinned` (it finishes on its build, whose workers must keep
running until `agentflow_builds` says it drained) or `park` (nothing could run it). Exit 1 when
any would park: a CI/CD gate.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from django.db import connection, transaction

from agentflow import _store as store
from agentflow._base.states import ACTIVE_RUN_STATUSES
from agentflow._builds import routing
from agentflow._core import builds
from agentflow.management.base import BaseCommand
from agentflow.models import WorkflowRun


class Command(BaseCommand):
    help = "List every unfinished run with what this build would do with it; exit 1 if any parks."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, json: bool, **options: Any) -> None:
        report = deploy_report()
        if json:
            self.stdout.write(_dumps(report))
        else:
            self._print(report)
        if report["summary"]["park"]:
            sys.exit(1)

    def _print(self, report: dict[str, Any]) -> None:
        self.stdout.write(f"build {report['build']}: {report['summary']}")
        for run in report["runs"]:
            at = run["position"]
            self.stdout.write(
                f"{run['run_id']} {run['workflow']} on {run['build']} at {at['seq']} "
                f"{at['step']}: {run['decision']}"
                + (f" ({run['reason']})" if run["reason"] else "")
            )
            if run["diff"]:
                self.stdout.write("    " + run["diff"].replace("\n", "\n    "))
            for effect in run["effects_past_divergence"]:
                amount = f" {effect['amount_cents']} cents" if "amount_cents" in effect else ""
                self.stdout.write(
                    f"    effect past it: {effect['seq']} {effect['step']} "
                    f"({effect['status']}){amount}"
                )


def deploy_report() -> dict[str, Any]:
    """The report, read in one read-only transaction."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION READ ONLY")
        ids = list(
            WorkflowRun.objects.filter(status__in=ACTIVE_RUN_STATUSES)
            .order_by("created_at")
            .values_list("id", "current_seq", "started_build")
        )
        runs = []
        for run_id, seq, started in ids:
            state = store.state_load(run_id, seq)
            if state is None:
                continue
            decision, check = routing.decide(state)
            runs.append(
                {
                    "run_id": run_id,
                    "workflow": state.workflow,
                    "started_on": started,
                    "build": state.build,
                    "position": {"seq": state.current_seq, "step": state.current_step},
                    "decision": decision,
                    "reason": check.reason
                    or ("declared pinned" if decision == "pinned" and state.pinned else ""),
                    "diff": check.diff(),
                    "effects_past_divergence": check.effects,
                }
            )
    summary = {
        word: sum(r["decision"] == word for r in runs) for word in ("upgrade", "pinned", "park")
    }
    keep = sorted({str(r["build"]) for r in runs if r["decision"] == "pinned"})
    return {
        "build": builds.current(),
        "runs": runs,
        "summary": {"runs": len(runs), **summary, "builds_to_keep": keep},
    }


def _dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, default=str)
