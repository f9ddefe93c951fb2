"""The figures at the top of the run list, each read without scanning the history.

At a million finished runs a COUNT over all runs by status costs ~100 ms per page view, and
the events table has no index on time alone. So:
- active, stuck and parked runs are counted exactly, each through its own partial index
  (`run_sweep_due`, `run_needs_attention`), and runs waiting for approval through the open
  waits' (`wait_open`): their cost follows the work in flight;
- finished runs are counted exactly while the table is small, then estimated from Postgres's
  statistics (the planner's row estimate: no rows read);
- the last hour's retries, takeovers and sweeps are counted among the newest events, read
  backwards along the primary key (ids grow with time), at most `RECENT_EVENTS` of them;
- the sweeper's age comes from the one row it writes per pass.
The page says which figures are estimates and why.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min, Q
from django.urls import reverse
from django.utils.http import urlencode

from agentflow import _store as store
from agentflow._base.states import ACTIVE_RUN_STATUSES, TERMINAL_RUN_STATUSES, RunStatus
from agentflow._builds import roster
from agentflow._conf import settings
from agentflow._observe import metrics
from agentflow.admin import counting
from agentflow.admin.counting import count_label, planner_estimate
from agentflow.admin.display import duration
from agentflow.models import RunEvent, WorkflowRun

#: Events read to count the last hour's activity: a few milliseconds at any history size.
RECENT_EVENTS = 10_000
RECENT_WINDOW = timedelta(hours=1)
#: The sweeper counts as silent after this many intervals without a pass (as /healthz does).
SWEEPER_GRACE_INTERVALS = 3


def status_counts() -> tuple[dict[str, int], bool]:
    """(runs per status, whether the finished statuses are estimates)."""
    runs = WorkflowRun.objects.order_by()

    def by_status(queryset: Any) -> Any:
        return queryset.values("status").annotate(n=Count("pk")).values_list("status", "n")

    counts = dict.fromkeys(RunStatus.values, 0)
    active = by_status(runs.filter(status__in=ACTIVE_RUN_STATUSES))
    parked = by_status(runs.filter(status=RunStatus.NEEDS_ATTENTION))
    # Unordered: from Django 6.1 a union takes the model's Meta.ordering, whose column
    # (created_at) is not among the counts' and Postgres refuses to order by it.
    counts.update(dict(active.union(parked, all=True).order_by()))
    total = planner_estimate(runs)
    if total is None or total <= counting.EXACT_COUNT_LIMIT:
        counts.update(dict(by_status(runs.filter(status__in=TERMINAL_RUN_STATUSES))))
        return counts, False
    for status in TERMINAL_RUN_STATUSES:
        counts[status] = planner_estimate(runs.filter(status=status)) or 0
    return counts, True


def recent_activity(now: datetime) -> dict[str, Any]:
    """Retries, takeovers and sweeps in the last hour, among the newest events."""
    since = now - RECENT_WINDOW
    newest = RunEvent.objects.order_by("-id")[:RECENT_EVENTS]
    figures = newest.aggregate(
        retries=Count("id", filter=Q(kind=RunEvent.Kind.ATTEMPT_FAILED, at__gte=since)),
        takeovers=Count("id", filter=Q(kind=RunEvent.Kind.TAKEOVER, at__gte=since)),
        sweeps=Count("id", filter=Q(kind=RunEvent.Kind.SWEEP_REQUEUE, at__gte=since)),
        read=Count("id"),
        oldest=Min("at"),
    )
    # Every event read was within the hour: there may be more, so the figures are floors.
    at_least = figures["read"] >= RECENT_EVENTS and figures["oldest"] >= since
    prefix = "≥ " if at_least else ""
    return {
        "at_least": at_least,
        **{
            name: {"n": figures[name], "label": prefix + count_label(figures[name], False)}
            for name in ("retries", "takeovers", "sweeps")
        },
    }


def sweeper_health() -> dict[str, Any]:
    """How long ago the sweeper last ran, by the database's clock, and whether that is late."""
    interval = settings.AGENTFLOW_SWEEP_INTERVAL
    beat = store.heartbeat_read()
    if beat is None:
        return {"ran": False, "late": True, "interval": interval}  # never ran here
    return {
        "ran": True,
        "late": beat.age_seconds > SWEEPER_GRACE_INTERVALS * interval,
        "age": duration(timedelta(seconds=beat.age_seconds)),
        "age_seconds": beat.age_seconds,
        "requeued": beat.requeued,
        "query_ms": round(beat.query_ms, 1),
        "interval": interval,
        "silent_after": SWEEPER_GRACE_INTERVALS * interval,
    }


def dashboard(now: datetime) -> dict[str, Any]:
    """Everything the dashboard template shows, in a constant number of queries."""
    counts, estimated = status_counts()
    runs = WorkflowRun.objects.order_by()
    stuck = runs.filter(status__in=ACTIVE_RUN_STATUSES, wake_at__lt=now).aggregate(
        n=Count("pk"), oldest=Min("wake_at")
    )
    base = reverse("admin:agentflow_workflowrun_changelist")

    def url(**params: str) -> str:
        return f"{base}?{urlencode(params)}"

    deciding = [(n, oldest) for _, n, oldest in metrics.waiting_for_approval_query()]
    approvals = sum(n for n, _ in deciding)
    oldest = min((at for _, at in deciding), default=None)
    terminal = set(TERMINAL_RUN_STATUSES)
    parked = counts[RunStatus.NEEDS_ATTENTION]
    return {
        "statuses": [
            {
                "value": value,
                "label": label,
                "count": count_label(counts[value], estimated and value in terminal),
                "approx": estimated and value in terminal,
                "url": url(status__exact=value),
            }
            for value, label in RunStatus.choices
        ],
        "estimated": estimated,
        "exact_limit": f"{counting.EXACT_COUNT_LIMIT:,}",
        "recent_events": f"{RECENT_EVENTS:,}",
        "active": count_label(sum(counts[s] for s in ACTIVE_RUN_STATUSES), False),
        "needs_attention": parked,
        "needs_attention_label": count_label(parked, False),
        "needs_attention_url": url(status__exact=RunStatus.NEEDS_ATTENTION),
        "approvals": approvals,
        "approvals_label": count_label(approvals, False),
        "approvals_oldest": duration(now - oldest) if oldest else None,
        "approvals_url": url(wake="approval"),
        "overdue": stuck["n"],
        "overdue_label": count_label(stuck["n"], False),
        "overdue_oldest": duration(now - stuck["oldest"]) if stuck["oldest"] else None,
        "overdue_url": url(wake="overdue"),
        "recent": recent_activity(now),
        "sweeper": sweeper_health(),
        "builds": roster.build_states(),
    }
