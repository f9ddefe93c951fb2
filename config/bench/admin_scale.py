"""The operator's pages at scale: the run list with its dashboard, filtered lists, a run page.

Adds to the sweeper's finished history (`sweep_scale.ensure_history`) what an operator's
database also holds: failed, cancelled and parked runs, active ones (some overdue), and events,
old and from the last hour. The rows are kept for the next run, like the history.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentflow._base.states import RunStatus
from agentflow.admin.dashboard import dashboard
from agentflow.models import RunEvent, WorkflowRun
from config.bench import synthetic
from config.bench.sweep_scale import HISTORY_ID_PREFIX, ensure_history

PREFIX = "wf_benchadmin_"
WORKFLOW = "bench_admin"
#: (status, how many, wake-up): the mix beside the finished history.
MIX = (
    (RunStatus.FAILED, 20_000, None),
    (RunStatus.CANCELLED, 2_000, None),
    (RunStatus.NEEDS_ATTENTION, 200, None),
    (RunStatus.WAITING, 500, "now() + interval '1 hour'"),
    (RunStatus.RUNNING, 500, "now() - interval '1 minute'"),  # overdue: the sweeper's backlog
)
REPETITIONS = 7


@dataclass(frozen=True, kw_only=True)
class PageFigure:
    name: str
    ms: float
    queries: int


def measure(
    *, history: int, events: int, progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    ensure_history(history, progress=progress)
    _ensure_mix(progress)
    _ensure_events(history, events, progress)
    progress("VACUUM ANALYZE")
    with connection.cursor() as cursor:
        for model in (WorkflowRun, RunEvent):
            cursor.execute(f"VACUUM ANALYZE {model._meta.db_table}")
    superuser = User(username="bench", is_staff=True, is_superuser=True, is_active=True)
    some_run = WorkflowRun.objects.filter(pk__startswith=PREFIX).order_by().values("pk").first()
    pages = [
        _time("dashboard alone", lambda: dashboard(timezone.now())),
        _page("run list", "", superuser),
        _page("run list, failed only", "?status__exact=FAILED", superuser),
        _page("run list, stuck now", "?wake=overdue", superuser),
    ]
    if some_run is not None:
        pages.append(_detail(some_run["pk"], superuser))
    return {
        "runs": WorkflowRun.objects.count(),
        "events": RunEvent.objects.count(),
        "pages": [figure.__dict__ for figure in pages],
    }


def _time(name: str, call: Callable[[], Any]) -> PageFigure:
    call()  # warm: first use of the plan cache and content types
    samples, queries = [], 0
    for _ in range(REPETITIONS):
        with CaptureQueriesContext(connection) as captured:
            started = time.perf_counter()
            call()
            samples.append((time.perf_counter() - started) * 1000)
        queries = len(captured.captured_queries)
    return PageFigure(name=name, ms=round(statistics.median(samples), 1), queries=queries)


def _page(name: str, query: str, user: User) -> PageFigure:
    model_admin = admin.site._registry[WorkflowRun]
    factory = RequestFactory()

    def render() -> None:
        request = factory.get(f"/admin/agentflow/workflowrun/{query}")
        request.user = user
        response = model_admin.changelist_view(request)
        response.render()  # type: ignore[attr-defined]

    return _time(name, render)


def _detail(run_id: str, user: User) -> PageFigure:
    model_admin = admin.site._registry[WorkflowRun]
    factory = RequestFactory()

    def render() -> None:
        request = factory.get(f"/admin/agentflow/workflowrun/{run_id}/change/")
        request.user = user
        response = model_admin.change_view(request, run_id)
        response.render()  # type: ignore[attr-defined]

    return _time("run page", render)


def _ensure_mix(progress: Callable[[str], None]) -> None:
    if WorkflowRun.objects.filter(workflow=WORKFLOW).exists():
        return
    progress("inserting failed, cancelled, parked and active runs")
    first = 1
    for status, count, wake_at in MIX:
        synthetic.runs_insert(
            prefix=PREFIX,
            workflow=WORKFLOW,
            status=status,
            first=first,
            last=first + count - 1,
            at_step=("step_3", 3),
            wake_at=wake_at or "NULL",
            created_at="now() - g * interval '37 second'",
        )
        first += count


def _ensure_events(history: int, count: int, progress: Callable[[str], None]) -> None:
    """`count` old events on the history's runs, then a last hour of retries and sweeps."""
    first_run = f"{HISTORY_ID_PREFIX}{1 + 1 % history:012d}"  # the first event's run
    if RunEvent.objects.filter(run_id=first_run, detail="old").exists():
        return
    progress(f"inserting {count:,} old events and a last hour of activity")
    synthetic.events_insert(
        prefix=HISTORY_ID_PREFIX,
        runs=history,
        count=count,
        at="now() - interval '2 hours' - (%(count)s - g) * interval '1 second'",
        kinds=["attempt_failed", "sweep_requeue", "operator_retry"],
        detail="old",
    )
    synthetic.events_insert(
        prefix=PREFIX,
        runs=500,
        count=3000,
        at="now() - (3600 - g) * interval '1 second'",
        kinds=["attempt_failed", "sweep_requeue", "takeover"],
        detail="recent",
    )
