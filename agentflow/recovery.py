"""The recovery sweeper (SPEC §3.4): re-enqueue active runs whose wake-up time has passed.

It never runs steps itself, it only rings the doorbell again. Publishing twice is harmless:
a duplicate message loses the claim, finds the step completed, or finds the run finished.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction
from django.utils import timezone

from agentflow import dispatch, registry, store, telemetry
from agentflow.models import RunEvent, WorkflowRun
from agentflow.states import ACTIVE_RUN_STATUSES

logger = logging.getLogger(__name__)


@dataclass
class SweepReport:
    requeued: list[str] = field(default_factory=list)
    parked: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    query_ms: float = 0.0


def due_runs_query(now, limit: int):  # type: ignore[no-untyped-def]
    """Exactly the query the partial index `run_sweep_due` serves."""
    return (
        WorkflowRun.objects.select_for_update(skip_locked=True)
        .filter(status__in=ACTIVE_RUN_STATUSES, wake_at__lte=now)
        .order_by("wake_at")
        .values_list("id", "workflow", "version", "current_seq", "status", "wake_at")[:limit]
    )


def sweep(*, limit: int | None = None) -> SweepReport:
    """One pass. Rows are locked with SKIP LOCKED and pushed forward in the same commit, so two
    sweepers at once never publish the same run twice."""
    close_old_connections()
    report = SweepReport()
    now = timezone.now()
    grace = store.enqueue_grace()
    to_publish: list[tuple[str, int]] = []
    with transaction.atomic():
        started = time.perf_counter()
        due = list(due_runs_query(now, limit or settings.AGENTFLOW_SWEEP_BATCH))
        report.query_ms = (time.perf_counter() - started) * 1000
        for run_id, workflow, version, seq, status, wake_at in due:
            try:
                with transaction.atomic():  # a savepoint: one broken run spoils nothing else
                    if registry.lookup(workflow, version) is None:
                        store.run_park(
                            run_id,
                            f"no definition {workflow} v{version} is deployed; "
                            "the sweeper cannot resume it",
                            kind=RunEvent.Kind.VERSION_MISMATCH,
                        )
                        report.parked.append(run_id)
                        continue
                    WorkflowRun.objects.filter(pk=run_id).update(
                        wake_at=now + grace, updated_at=now
                    )
                    lateness = (now - wake_at).total_seconds()
                    store.event_add(
                        run_id,
                        RunEvent.Kind.SWEEP_REQUEUE,
                        f"{status} at step {seq}, {lateness:.1f} s past its wake-up time",
                        actor="sweeper",
                    )
                to_publish.append((run_id, seq))
                report.requeued.append(run_id)
            except DatabaseError as exc:
                logger.exception("sweeper skipped run %s", run_id)
                report.errors.append(f"{run_id}: {exc}")
    for run_id, seq in to_publish:
        dispatch.send_step(run_id, seq)
    store.heartbeat_record(requeued=len(report.requeued), query_ms=report.query_ms)
    telemetry.sweep_finished(
        requeued=report.requeued, parked=report.parked, query_ms=report.query_ms
    )
    return report
