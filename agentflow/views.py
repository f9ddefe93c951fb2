"""Operational endpoints: health (database, broker, sweeper) and Prometheus metrics."""

from __future__ import annotations

from celery import current_app
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from agentflow import limits, store
from agentflow import metrics as run_metrics
from agentflow.conf import settings

#: The sweeper is late once this many intervals passed without a sweep: one missed tick is
#: noise (a busy worker), three mean nobody is sweeping and recovery has stopped.
SWEEPER_LATE_INTERVALS = 3


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database, the broker and the recovery sweeper are all well, else 503 with
    the one that is not named. The sweeper's age comes from its heartbeat row (database time)."""
    checks: dict[str, str] = {}
    report: dict[str, object] = {}
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        with current_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"error: {type(exc).__name__}"
    if checks["database"] == "ok":
        checks["sweeper"], report["sweeper_age_seconds"] = _sweeper()
    else:
        checks["sweeper"] = "unknown: the database is unreachable"
    healthy = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if healthy else "error", **checks, **report},
        status=200 if healthy else 503,
    )


def _sweeper() -> tuple[str, float | None]:
    limit = SWEEPER_LATE_INTERVALS * settings.AGENTFLOW_SWEEP_INTERVAL
    try:
        beat = store.heartbeat_read()
    except Exception as exc:
        return f"error: {type(exc).__name__}", None
    if beat is None:
        return "error: the sweeper never ran (is celery beat running?)", None
    age = round(max(beat.age_seconds, 0.0), 1)
    if age > limit:
        return f"error: no sweep for {age:.0f} s (limit {limit} s; is celery beat running?)", age
    return "ok", age


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if run_metrics.closed():
        raise Http404("no metrics here")  # as if there were no such page
    if not run_metrics.authorized(request.headers.get("Authorization", "")):
        response = HttpResponse(
            "a bearer token is required\n", status=401, content_type="text/plain"
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if not run_metrics.available():  # django-agentflow[prometheus] not installed: say so, plainly
        return HttpResponse(run_metrics.MISSING + "\n", status=501, content_type="text/plain")
    return HttpResponse(
        run_metrics.exposition(
            heartbeat=store.heartbeat_read,
            partners=lambda: store.partners_view(limits.configured()),
        ),
        content_type=run_metrics.CONTENT_TYPE,
    )
