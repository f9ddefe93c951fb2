"""`manage.py bench_admin --json` at toy sizes: the operator's database it builds (through
`config.bench.synthetic`) and the report's shape, never its speed."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import Count

from agentflow.models import RunEvent, WorkflowRun


@pytest.mark.django_db(transaction=True)
def test_bench_admin__builds_the_mix_and_the_events_then_times_every_page() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("bench_admin measures Postgres")
    out = io.StringIO()

    call_command(
        "bench_admin",
        "--json",
        "--history",
        "300",
        "--events",
        "600",
        stdout=out,
        stderr=io.StringIO(),
    )

    report = json.loads(out.getvalue())
    mix = dict(
        WorkflowRun.objects.filter(workflow="bench_admin")
        .values_list("status")
        .annotate(n=Count("id"))
    )
    assert mix == {
        "FAILED": 20_000,
        "CANCELLED": 2_000,
        "NEEDS_ATTENTION": 200,
        "WAITING": 500,
        "RUNNING": 500,
    }
    assert WorkflowRun.objects.filter(workflow="bench_history").count() == 300
    overdue = WorkflowRun.objects.filter(workflow="bench_admin", status="RUNNING").first()
    assert overdue is not None and overdue.current_step == "step_3" and overdue.wake_at
    events = dict(RunEvent.objects.values_list("detail").annotate(n=Count("id")))
    assert events == {"old": 600, "recent": 3000}
    assert set(RunEvent.objects.values_list("kind", flat=True)) == {
        "attempt_failed",
        "sweep_requeue",
        "operator_retry",
        "takeover",
    }
    assert (report["runs"], report["events"]) == (300 + 23_200, 3_600)
    pages = {page["name"]: page for page in report["pages"]}
    assert set(pages) == {
        "dashboard alone",
        "run list",
        "run list, failed only",
        "run list, stuck now",
        "run page",
    }
    assert all(page["ms"] > 0 and page["queries"] > 0 for page in pages.values())
