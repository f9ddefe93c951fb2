"""Operational endpoints: health (database and broker) and Prometheus metrics."""

from __future__ import annotations

from django.db import connection
from django.db.models import Count
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET

from agentflow.celery import app
from agentflow.models import WorkflowRun
from agentflow.states import ACTIVE_RUN_STATUSES, RunStatus


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    checks: dict[str, str] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"error: {type(exc).__name__}"
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "error", **checks}, status=200 if healthy else 503
    )


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    counts = dict(
        WorkflowRun.objects.values_list("status").annotate(n=Count("id")).values_list("status", "n")
    )
    overdue = WorkflowRun.objects.filter(
        status__in=ACTIVE_RUN_STATUSES, wake_at__lte=timezone.now()
    ).count()
    lines = [
        "# HELP agentflow_runs Workflow runs by status.",
        "# TYPE agentflow_runs gauge",
    ]
    lines += [
        f'agentflow_runs{{status="{status}"}} {counts.get(status, 0)}'
        for status in RunStatus.values
    ]
    lines += [
        "# HELP agentflow_runs_overdue Active runs past their wake-up time.",
        "# TYPE agentflow_runs_overdue gauge",
        f"agentflow_runs_overdue {overdue}",
    ]
    return HttpResponse("\n".join(lines) + "\n", content_type="text/plain; version=0.0.4")
