"""Prometheus metrics: what happened, counted in each process; what is now, read from Postgres.

Two sources, each where it stays right when processes die:
- Counters and histograms (steps timed, runs started and finished, events, sweeps, partner
  errors, model tokens) are written by whichever process saw the thing happen, a gunicorn
  worker or a Celery pool child, into prometheus_client's multiprocess files (one per process,
  in PROMETHEUS_MULTIPROC_DIR). A scrape adds them up. A killed process's file stays, so no
  series goes backwards or disappears when a pool child is SIGKILLed mid-step; its replacement
  writes a file of its own.
- Gauges of state (active runs by workflow and status, overdue, needs attention, waiting for
  approval, the sweeper's age) are read from Postgres at scrape time: a gauge kept in a process
  would die with it. The queries are served by the partial indexes over active and parked runs
  and open waits, so a scrape costs the same at a million finished runs as at none.
"""

from __future__ import annotations

import hmac
import importlib.util
import logging
import math
import os
from collections.abc import Callable, Iterator
from decimal import Decimal
from functools import cache
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from django.db.models import Count, F, Min, Q, QuerySet
from django.db.models.functions import Now

from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus, WaitKind
from agentflow._conf import settings
from agentflow._core import outage, registry
from agentflow.models import Build, RunWait, WorkflowRun

#: Builds listed by `agentflow_runs_by_build` even with no run left (newest first).
RECENT_BUILDS = 10

logger = logging.getLogger("agentflow.metrics")  # the name hosts' LOGGING knows

# prometheus_client is optional (the `prometheus` extra) and the engine imports without it, so
# it, and `agentflow._observe.metric_files` which imports it, are imported in the functions that
# run only
# once it is found (each such import says "optional").

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MISSING = "metrics need prometheus_client: pip install 'django-agentflow[prometheus]'"


def available() -> bool:
    return importlib.util.find_spec("prometheus_client") is not None


def multiprocess() -> bool:
    """prometheus_client's multiprocess mode, when the host set PROMETHEUS_MULTIPROC_DIR (this
    repo's site does: every gunicorn worker and Celery pool child writes its own file)."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


@cache
def _prepared() -> bool:
    """Once, before the first metric: in multiprocess mode, name this process's files
    host-pidns-pid-start (agentflow._observe.metric_files). False when prometheus_client is
    missing."""
    if not available():
        return False
    if multiprocess():
        from agentflow._observe import metric_files

        metric_files.install()
    return True


class _Null:
    """What a metric is without prometheus_client: counts nothing."""

    def labels(self, *values: Any) -> _Null:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


class _Metric:
    """A metric created on its first use, so importing the engine touches no metric files."""

    def __init__(self, kind: str, *args: Any, **kwargs: Any) -> None:
        self._make: Callable[[], Any] = lambda: self._create(kind, args, kwargs)
        self._made: Any = None

    @staticmethod
    def _create(kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not _prepared():
            return _Null()
        import prometheus_client  # optional

        return getattr(prometheus_client, kind)(*args, **kwargs)

    def _metric(self) -> Any:
        if self._made is None:
            self._made = self._make()
        return self._made

    def labels(self, *values: Any) -> Any:
        return self._metric().labels(*values)

    def inc(self, amount: float = 1) -> None:
        self._metric().inc(amount)


RUNS_STARTED = _Metric(
    "Counter", "agentflow_runs_started", "Runs started, by workflow.", ["workflow"]
)
RUNS_FINISHED = _Metric(
    "Counter",
    "agentflow_runs_finished",
    "Runs that reached COMPLETED, FAILED or CANCELLED (an operator retry of a failed run can "
    "finish it again).",
    ["workflow", "status"],
)
#: From a quick read step (~1 ms) to a partner call that times out (10 s and more).
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
STEP_SECONDS = _Metric(
    "Histogram",
    "agentflow_step_duration_seconds",
    "One step attempt in the worker, from its claim to its recorded outcome.",
    ["workflow", "step", "kind"],
    buckets=STEP_BUCKETS,
)
RUN_EVENTS = _Metric(
    "Counter",
    "agentflow_run_events",
    "Run events by kind: attempt_failed (a retry), takeover, outcome_unknown, sweep_requeue "
    "(a re-enqueue), reconciled, late_completion, needs_attention and operator actions.",
    ["kind"],
)
SWEEPS = _Metric("Counter", "agentflow_sweeps", "Sweeper passes.")
SWEEP_REQUEUED = _Metric(
    "Counter", "agentflow_sweep_requeued_runs", "Runs the sweeper re-published."
)
STRAY_STEP_MESSAGES = _Metric(
    "Counter",
    "agentflow_stray_step_messages",
    "Step messages for runs this database does not know, by who published them: "
    "another_deployment (stamped with another database: two deployments share the broker's "
    "queue) or unstamped (a publisher that does not say).",
    ["published_by"],
)
PARTNER_ERRORS = _Metric(
    "Counter",
    "agentflow_partner_errors",
    "Errors from partner calls, by partner and kind (retryable, permanent, unexpected).",
    ["partner", "kind"],
)
MODEL_TOKENS_SPENT = _Metric(
    "Counter",
    "agentflow_model_tokens_spent",
    "Model tokens paid for, by workflow and model.",
    ["workflow", "model"],
)
MODEL_TOKENS_SAVED = _Metric(
    "Counter",
    "agentflow_model_tokens_saved",
    "Model tokens not spent again because a recorded answer was replayed.",
    ["workflow", "model"],
)

MODEL_COST_SPENT = _Metric(
    "Counter",
    "agentflow_model_cost_usd",
    "Dollars model requests cost (priced models only), by workflow and the model that answered.",
    ["workflow", "model"],
)
MODEL_COST_SAVED = _Metric(
    "Counter",
    "agentflow_model_cost_saved_usd",
    "Dollars not spent again because a recorded answer was replayed (priced turns only).",
    ["workflow", "model"],
)
MODEL_TURNS_UNPRICED = _Metric(
    "Counter",
    "agentflow_model_turns_unpriced",
    "Model turns the price table has no price for: their cost is unknown, never counted as 0.",
    ["workflow", "model"],
)


def fold_dead() -> None:
    """Fold dead processes' files into the archive (multiprocess mode only)."""
    if _prepared() and multiprocess():
        from agentflow._observe import metric_files

        metric_files.fold_dead()


def model_tokens(*, workflow: str, model: str, spent: int = 0, saved: int = 0) -> None:
    """Count a model call's tokens: `spent` when the model was asked, `saved` when its recorded
    answer was replayed instead (agent mode calls this once per `ctx.llm`)."""
    if spent < 0 or saved < 0:
        raise ValueError("token counts cannot be negative")
    if spent:
        MODEL_TOKENS_SPENT.labels(workflow, model).inc(spent)
    if saved:
        MODEL_TOKENS_SAVED.labels(workflow, model).inc(saved)


def model_cost_spent(*, workflow: str, model: str, cost: Decimal | None) -> None:
    """Count the dollars a model turn just asked cost (None: its model has no price, counted
    as an unpriced turn rather than as free)."""
    if cost is None:
        MODEL_TURNS_UNPRICED.labels(workflow, model).inc()
    elif cost > 0:
        MODEL_COST_SPENT.labels(workflow, model).inc(float(cost))


def model_cost_saved(*, workflow: str, model: str, saved: Decimal) -> None:
    """Count the recorded dollars of turns a replay handed back instead of asking again."""
    if saved > 0:
        MODEL_COST_SAVED.labels(workflow, model).inc(float(saved))


def active_runs_query() -> QuerySet[WorkflowRun, tuple[str, str, str, int, int]]:
    """Active runs and overdue ones by workflow, status and the build they are on
    (docs/deploys.md, "Builds"), served by `run_sweep_due` (whose predicate is exactly this status
    list): its cost follows the runs in flight."""
    return (
        WorkflowRun.objects.filter(status__in=ACTIVE_RUN_STATUSES)
        .order_by()
        .values_list("workflow", "status", "build")
        .annotate(n=Count("pk"), late=Count("pk", filter=Q(wake_at__lte=Now())))
    )


def waiting_for_approval_query() -> QuerySet[RunWait, tuple[str, int, Any]]:
    """Runs waiting for an operator's decision, by workflow, with the oldest request's time:
    open waits at their run's current position, served by `wait_open` (open waits only)."""
    return (
        RunWait.objects.filter(
            resolved_at__isnull=True,
            kind=WaitKind.APPROVAL,
            run__status=RunStatus.WAITING,
            run__current_seq=F("seq"),
            run__branch=F("branch"),
        )
        .order_by()
        .values_list("run__workflow")
        .annotate(n=Count("pk"), oldest=Min("requested_at"))
    )


def parked_runs_query() -> QuerySet[WorkflowRun, tuple[str, int]]:
    """Parked runs by workflow, served by `run_needs_attention`."""
    return (
        WorkflowRun.objects.filter(status=RunStatus.NEEDS_ATTENTION)
        .order_by()
        .values_list("workflow")
        .annotate(n=Count("pk"))
    )


#: The gauges read from the database at scrape time: name, help, labels.
GAUGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("agentflow_runs_active", "Runs not finished, by workflow and status.", ("workflow", "status")),
    (
        "agentflow_runs_overdue",
        "Active runs past their wake-up time (the sweeper's backlog).",
        ("workflow",),
    ),
    (
        "agentflow_runs_needs_attention",
        "Runs parked for an operator (NEEDS_ATTENTION).",
        ("workflow",),
    ),
    (
        "agentflow_runs_waiting_for_approval",
        "Runs waiting for an operator to approve or reject a call.",
        ("workflow",),
    ),
    (
        "agentflow_sweeper_seconds_since_last_sweep",
        "Seconds since the recovery sweeper last finished a pass, by the database's clock "
        "(+Inf if it never ran against this database).",
        (),
    ),
    (
        "agentflow_runs_by_build",
        "Runs not finished, by the build whose code runs them: a build whose count is "
        "0 has drained.",
        ("build",),
    ),
)
PARTNER_GAUGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("agentflow_partner_in_flight", "Calls to the partner in flight now.", ("partner",)),
    (
        "agentflow_partner_waiting_runs",
        "Steps waiting for their turn at the partner, by what they wait for.",
        ("partner", "reason"),
    ),
    (
        "agentflow_partner_breaker_state",
        "The partner's breaker: 0 closed, 1 half open (a probe is out), 2 open; 3 paused by an "
        "operator.",
        ("partner",),
    ),
)
SCHEDULE_GAUGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "agentflow_schedule_seconds_since_last_slot",
        "Seconds since the run of the schedule's latest slot was started, by the schedules' clock "
        "(+Inf if none ever was): above its period plus a sweep, a slot is late.",
        ("schedule",),
    ),
    (
        "agentflow_schedule_missed_slots",
        "Slots of the schedule skipped as missed: older than its catch-up window when a beat or "
        "sweeper first saw them.",
        ("schedule",),
    ),
)
#: A gauge's series: its label values -> its value.
Series = dict[tuple[str, ...], float]

#: The series of this process's last scrape that could read the database: while it cannot, each
#: is served as NaN (unknown) rather than left out, which would read as a scrape gap or as 0.
_last_read: dict[str, Series] = {}


class _StateFromDatabase:
    """Gauges read at scrape time, in four statements that touch no finished run."""

    def __init__(
        self,
        heartbeat: Callable[[], Any],
        partners: Callable[[], list[Any]] | None = None,
        features: Callable[[], dict[str, Series]] | None = None,
    ) -> None:
        self._heartbeat = heartbeat
        self._partners = partners
        self._features = features

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily  # optional

        up = GaugeMetricFamily(
            "agentflow_database_up",
            "1 when this scrape read the gauges below from the database; 0 when it could not, "
            "and each of them is NaN (unknown).",
        )
        gauges = GAUGES + (PARTNER_GAUGES if self._partners is not None else ())
        gauges += SCHEDULE_GAUGES if self._features is not None else ()
        try:
            values = self._read()
        except DatabaseError as exc:
            # The counters still go out, and every gauge says it is unknown.
            if outage.unreachable(exc):
                outage.noticed(exc, "reading the gauges for /metrics")
            else:
                logger.warning("metrics: the database gauges are unknown this scrape: %s", exc)
            up.add_metric([], 0)
            values = {name: _unknown(name) for name, _, _ in gauges}
        else:
            up.add_metric([], 1)
            global _last_read
            _last_read = values
        yield up
        for name, documentation, labels in gauges:
            family = GaugeMetricFamily(name, documentation, labels=list(labels))
            for label_values, value in sorted(values.get(name, {}).items()):
                family.add_metric(list(label_values), value)
            yield family

    def _read(self) -> dict[str, Series]:
        known = sorted(registry.names())
        active: Series = {
            (name, str(status)): 0 for name in known for status in ACTIVE_RUN_STATUSES
        }
        late: Series = {(name,): 0 for name in known}
        # The newest builds stay listed at 0 once drained (a series that vanished would read as
        # a scrape gap, not as "safe to stop").
        per_build: Series = {
            (build or "(none)",): 0
            for build in Build.objects.values_list("pk", flat=True)[:RECENT_BUILDS]
        }
        for workflow, status, build, n, n_late in active_runs_query():
            key = (workflow, str(status))
            active[key] = active.get(key, 0) + n
            late[(workflow,)] = late.get((workflow,), 0) + n_late
            per_build[(build or "(none)",)] = per_build.get((build or "(none)",), 0) + n
        parked: Series = {(name,): 0 for name in known}
        parked.update(((workflow,), n) for workflow, n in parked_runs_query())
        deciding: Series = {(name,): 0 for name in known}
        deciding.update(((workflow,), n) for workflow, n, _ in waiting_for_approval_query())
        beat = self._heartbeat()
        sweeper: Series = {(): math.inf if beat is None else max(beat.age_seconds, 0.0)}
        values: dict[str, Series] = {
            "agentflow_runs_active": active,
            "agentflow_runs_overdue": late,
            "agentflow_runs_needs_attention": parked,
            "agentflow_runs_waiting_for_approval": deciding,
            "agentflow_sweeper_seconds_since_last_sweep": sweeper,
            "agentflow_runs_by_build": per_build,
        }
        if self._partners is not None:
            values.update(_partner_series(self._partners()))
        if self._features is not None:
            values.update(self._features())
        return values


def _unknown(name: str) -> Series:
    """NaN for every series of gauge `name` this process served before, and for those it can
    name without the database (every registered workflow; the sweeper's one)."""
    series = dict.fromkeys(_last_read.get(name, {}), math.nan)
    known = sorted(registry.names())
    if name == "agentflow_runs_active":
        series.update(
            ((workflow, str(status)), math.nan)
            for workflow in known
            for status in ACTIVE_RUN_STATUSES
        )
    elif name in (
        "agentflow_runs_overdue",
        "agentflow_runs_needs_attention",
        "agentflow_runs_waiting_for_approval",
    ):
        series.update(((workflow,), math.nan) for workflow in known)
    elif name == "agentflow_sweeper_seconds_since_last_sweep":
        series[()] = math.nan
    return series


#: The breaker's states as a gauge's value.
BREAKER_VALUES = {"closed": 0, "half_open": 1, "open": 2}


def _partner_series(partners: list[Any]) -> dict[str, Series]:
    """Per limited partner (docs/partner-limits.md, "What happens"): calls in flight, runs waiting
    for a turn, the breaker."""
    flight: Series = {}
    waiting: Series = {}
    breaker: Series = {}
    for view in partners:
        flight[(view.partner,)] = view.in_flight
        for reason, n in view.waiting_by_reason.items():
            waiting[(view.partner, reason)] = n
        breaker[(view.partner,)] = 3 if view.paused else BREAKER_VALUES[view.breaker]
    return {
        "agentflow_partner_in_flight": flight,
        "agentflow_partner_waiting_runs": waiting,
        "agentflow_partner_breaker_state": breaker,
    }


class _Counted:
    """The counters and histograms: in multiprocess mode every process's, live or dead, added
    up; otherwise this process's own."""

    def collect(self) -> Iterator[Any]:
        if multiprocess():
            from agentflow._observe import metric_files

            metric_files.fold_dead()  # keeps the files read to the live processes plus one
            yield from metric_files.collect()
        else:
            from prometheus_client import REGISTRY  # optional

            yield from REGISTRY.collect()


def exposition(
    *,
    heartbeat: Callable[[], Any],
    partners: Callable[[], list[Any]] | None = None,
    gauges: Callable[[], dict[str, Series]] | None = None,
) -> bytes:
    """The text a scrape returns: the counters, then the database's gauges. `heartbeat`: the
    store's read of the sweeper's last pass (`store.heartbeat_read`), handed in by the view,
    since the store counts its events through this module and so cannot be imported here;
    `partners` likewise (`agentflow._limits.store.partners_view` of the limits in force), and
    `gauges` (what the features beside the core measure, `agentflow._core.features.gauges`: the
    schedules')."""
    if not _prepared():
        raise ImproperlyConfigured(MISSING)
    from prometheus_client import CollectorRegistry, generate_latest  # optional

    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(_Counted())  # type: ignore[arg-type]
    scrape.register(_StateFromDatabase(heartbeat, partners, gauges))  # type: ignore[arg-type]
    return generate_latest(scrape)


def file_count() -> int:
    """How many per-process files a scrape reads (0 outside multiprocess mode)."""
    if not (_prepared() and multiprocess()):
        return 0
    from agentflow._observe import metric_files

    return len(metric_files.readable_files())


def closed() -> bool:
    """No token and nobody said /metrics may be open: with DEBUG off it is not served at all."""
    return not (
        settings.AGENTFLOW_METRICS_TOKEN or settings.AGENTFLOW_METRICS_PUBLIC or settings.DEBUG
    )


def authorized(header: str) -> bool:
    """True when no token is configured (and not `closed()`), or `header` is `Bearer <the
    token>` (constant time)."""
    token = settings.AGENTFLOW_METRICS_TOKEN
    if not token:
        return not closed()
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        # A header may hold any character (a test client's, a lone surrogate): never an error.
        given.strip().encode("utf-8", "surrogatepass"),
        token.encode(),
    )
