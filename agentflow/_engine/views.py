"""Operational endpoints: health (database, broker, sweeper) and Prometheus metrics."""

from __future__ import annotations

from celery import current_app
from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from agentflow import _store as store
from agentflow._conf import settings
from agentflow._core import features, outage
from agentflow._limits import rules
from agentflow._limits.store import partners_view
from agentflow._observe import metrics as run_metrics

#: The sweeper is late once this many intervals passed without a sweep: one missed tick is
#: noise (a busy worker), three mean nobody is sweeping and recovery has stopped.
SWEEPER_LATE_INTERVALS = 3


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when the database, the broker and the recovery sweeper are all well, else 503 with
    the one that is not named. The sweeper's age comes from its heartbeat row (database time);
    a sweep missed while the database was down blames the database, not beat."""
    checks: dict[str, str] = {}
    report: dict[str, object] = {}
    outage_told = False  # down, or just back: this process says so once, not once per probe
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        checks["database"] = "ok"
    except Exception as exc:
        if outage.unreachable(exc):
            outage.noticed(exc, "answering /healthz")
            outage_told = True
            checks["database"] = f"error: the database is unreachable ({type(exc).__name__})"
        else:
            checks["database"] = f"error: {type(exc).__name__}"
    try:
        with current_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"error: {type(exc).__name__}"
    if checks["database"] == "ok":
        checks["sweeper"], report["sweeper_age_seconds"], recovering = _sweeper()
        if recovering:
            checks["database"], outage_told = recovering, True
    else:
        checks["sweeper"] = "unknown: the database is unreachable"
    healthy = all(value == "ok" for value in checks.values())
    response = JsonResponse(
        {"status": "ok" if healthy else "error", **checks, **report},
        status=200 if healthy else 503,
    )
    if outage_told and checks["broker"] == "ok":
        return outage.retry_later(response)
    return response


def _sweeper() -> tuple[str, float | None, str]:
    """The sweeper's check, its age, and what to say of the database if the sweeper is late
    only because the database was down ("" otherwise)."""
    interval = settings.AGENTFLOW_SWEEP_INTERVAL
    limit = SWEEPER_LATE_INTERVALS * interval
    try:
        beat = store.heartbeat_read()
    except Exception as exc:
        return f"error: {type(exc).__name__}", None, ""
    if beat is None:
        back = _database_back_seconds(store.database_restarted_seconds())
        if back is not None and back < limit:
            # Beat may have started while the database was down: it has had no chance yet.
            return (
                f"waiting: no sweep yet, as the database was unreachable; the first is due "
                f"within {interval} s",
                None,
                f"recovering: the database answered again {back:.1f} s ago, after an outage",
            )
        return "error: the sweeper never ran (is celery beat running?)", None, ""
    age = round(max(beat.age_seconds, 0.0), 1)
    if age <= limit:
        return "ok", age, ""
    back = _database_back_seconds(beat.database_seconds)
    if back is not None and back < min(age, limit):
        # No sweep since the database came back, and beat has had less than the limit to make
        # one: the database was the trouble (beat could not sweep without it), not beat.
        return (
            f"waiting: no sweep for {age:.0f} s, as the database was unreachable; the next "
            f"is due within {interval} s",
            age,
            f"recovering: the database answered again {back:.1f} s ago, after an outage",
        )
    return f"error: no sweep for {age:.0f} s (limit {limit} s; is celery beat running?)", age, ""


def _database_back_seconds(restarted: float | None) -> float | None:
    """Seconds since the database answered again after an outage: since the server last ended
    every session (it restarted), or since this process found it back, whichever is later."""
    candidates = [s for s in (restarted, outage.answered_seconds_ago()) if s is not None]
    return min(candidates) if candidates else None


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
            partners=lambda: partners_view(rules.configured()),
            gauges=features.gauges,
        ),
        content_type=run_metrics.CONTENT_TYPE,
    )
