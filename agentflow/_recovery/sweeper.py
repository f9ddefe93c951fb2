"""The recovery sweeper (docs/protocol.md, "The sweeper"): ring the doorbell again for active runs
that stopped moving.

It never runs steps itself. It re-publishes runs past their wake-up time (a lost message, a
lease that ran out, a retry time reached; while no worker answers, each time after a doubled
gap: `agentflow._sweeps.backoff`) and, on Postgres, runs whose step's owner has lost its
advisory lock (its process died, on any host: docs/protocol.md, "Liveness"), without waiting for the
lease. Where each goes (the shared queue, or the build queue of a pinned run) and whether a held one
may go now is `agentflow._builds.routing`'s to say: a pinned run with no live worker of its build
is held
rather than published to a queue nobody reads.
Publishing twice is harmless: a duplicate message loses the claim, finds the step completed,
or finds the run finished. Every decision uses the database's clock.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from django.db import DatabaseError, close_old_connections, transaction

from agentflow import _store as store
from agentflow._builds import routing
from agentflow._conf import settings
from agentflow._core import dispatch, features, outage
from agentflow._observe import telemetry

logger = logging.getLogger("agentflow.sweeper")  # the name hosts' LOGGING knows


@dataclass
class SweepReport:
    requeued: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)
    #: Pinned runs with no live worker of their build: held, not published
    #: (docs/deploys.md, "Builds").
    held: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    query_ms: float = 0.0


def sweep(*, limit: int | None = None) -> SweepReport:
    """One pass. Rows are locked with SKIP LOCKED and pushed forward in the same commit, so two
    sweepers at once never publish the same run twice."""
    close_old_connections()
    report = SweepReport()
    ready: list[routing.Route] = []
    with transaction.atomic():
        started = time.perf_counter()
        due = store.sweep_due(limit or settings.AGENTFLOW_SWEEP_BATCH)
        report.query_ms = (time.perf_counter() - started) * 1000
        still_held: list[store.DueRun] = []
        for route in routing.sweep_routes(due):
            if route.hold is None:
                ready.append(route)
            elif not route.new_hold:
                still_held.append(route.run)
            else:
                try:
                    with transaction.atomic():  # a savepoint: one broken run spoils nothing else
                        if routing.hold_due(route):
                            report.held.append(route.run.id)
                except DatabaseError as exc:
                    logger.exception("sweeper skipped run %s", route.run.id)
                    report.errors.append(f"{route.run.id}: {exc}")
        store.sweep_keep_held(still_held, routing.HOLD_RECHECK_SECONDS)
        store.sweep_push([route.run for route in ready])
    unsent: list[str] = []
    for route in ready:
        run = route.run
        if route.queue is None:
            sent = dispatch.send_step(run.id, run.seq, priority=run.priority)
        else:
            sent = dispatch.send_step(run.id, run.seq, queue=route.queue, priority=run.priority)
        report.requeued.append(run.id)
        if not sent:
            unsent.append(run.id)
    _refused(unsent)
    _feature_parts()
    _concurrency_places()
    store.heartbeat_record(requeued=len(report.requeued), query_ms=report.query_ms)
    telemetry.sweep_finished(  # counts the pass; logs which runs, and nothing when idle
        requeued=report.requeued, parked=report.parked, query_ms=report.query_ms
    )
    return report


def _concurrency_places() -> None:
    """Runs waiting for a concurrency key whose place is free (its hand-off lost when the run
    before them ended in a crash) are admitted: nobody else would."""
    try:
        store.concurrency_sweep()
    except DatabaseError as exc:
        if outage.unreachable(exc):
            raise
        logger.exception("sweeper: runs waiting for a concurrency key were not looked at")


def _refused(run_ids: list[str]) -> None:
    """Re-publishes the broker refused count as no ring: their runs are tried again a lease
    on, not a back-off later (docs/how-it-works.md)."""
    try:
        store.sweep_unsent(run_ids)
    except DatabaseError as exc:
        if outage.unreachable(exc):
            raise  # the whole pass failed: its caller says so, once per outage
        logger.exception("sweeper: runs the broker refused keep their back-off this pass")


def _feature_parts() -> None:
    """What features beside the core do at every pass (`agentflow._core.features`), in the
    order registered: partner limits hand freed places at a partner to its oldest waiters
    (docs/partner-limits.md, "What happens"); the schedules' due slots become runs
    (docs/schedules.md), so a slot needs no process of its own and any beat or sweeper may
    start it. One part failing leaves the others their turn."""
    for part in features.sweep_parts():
        try:
            part.run()
        except DatabaseError as exc:
            if outage.unreachable(exc):
                raise  # the whole pass failed: its caller says so, once per outage
            logger.exception("sweeper: %s this pass", part.what)
