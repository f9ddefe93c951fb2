"""Celery beat with the recovery sweeper and retention in it
(docs/protocol.md, "The sweeper", "Retention").

Every `AGENTFLOW_SWEEP_INTERVAL` seconds beat sweeps itself rather than sending a task: a sweep
is a few milliseconds of SQL and a handful of publishes, and run here it never waits behind a
backlog of steps, never expires unseen in a queue, and needs no worker to be free exactly when
workers are the thing that died. Recovery then stands on one process, the one `/healthz` and
`/metrics` watch through the sweeper's heartbeat. Retention (`agentflow.purge`) is sent to the
workers hourly when AGENTFLOW_RETENTION_DAYS is set.

`CELERY_BEAT_SCHEDULER = "agentflow.beat:Scheduler"` selects it for `celery -A <app> beat` and
the embedded beat of `worker -B`. A host on another scheduler (django-celery-beat's
`DatabaseScheduler`) mixes `SweeperMixin` into it:
`class Scheduler(SweeperMixin, DatabaseScheduler): pass`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from celery.beat import PersistentScheduler

from agentflow._conf import settings
from agentflow._core import outage
from agentflow._recovery import sweeper

logger = logging.getLogger(__name__)

PURGE_TASK = "agentflow.purge"
#: Retention runs hourly; a tick stays well inside the task time limit however large the
#: backlog (agentflow._engine.tasks deletes a bounded number of batches), the next goes on from
#: there.
RETENTION_INTERVAL_SECONDS = 3600.0


class SweeperMixin:
    """Sweeps in the scheduler's own loop, and sends retention's task, beside whatever schedule
    the scheduler it is mixed into keeps."""

    app: Any
    _next_sweep: float | None = None
    _next_retention = 0.0

    def tick(self, *args: Any, **kwargs: Any) -> float:
        wait: float = super().tick(*args, **kwargs)  # type: ignore[misc]
        now = time.monotonic()
        interval = float(settings.AGENTFLOW_SWEEP_INTERVAL)
        if self._next_sweep is None:
            # The first of each one interval, and one hour, after beat starts: a beat started
            # beside messages just published must not find them all due at once.
            self._next_sweep = now + interval
            self._next_retention = now + RETENTION_INTERVAL_SECONDS
        if now >= self._next_sweep:
            self._next_sweep = now + interval
            self._sweep(interval)
        if settings.AGENTFLOW_RETENTION_DAYS and now >= self._next_retention:
            self._next_retention = now + RETENTION_INTERVAL_SECONDS
            self._send_retention()
        return min(wait, max(self._next_sweep - time.monotonic(), 0.0))

    def _sweep(self, interval: float) -> None:
        try:
            sweeper.sweep()
        except Exception as exc:  # the next tick tries again
            if outage.unreachable(exc):
                outage.noticed(exc, "sweeping")  # once per outage, not once per tick
                return
            logger.exception("sweep failed; the next one is due in %s s", interval)

    def _send_retention(self) -> None:
        try:
            # Early-acked and expiring: a lost tick is made up by the next one.
            self.app.send_task(PURGE_TASK, expires=RETENTION_INTERVAL_SECONDS * 0.9)
        except Exception:  # the broker is away: next hour's tick sends it
            logger.exception("could not send %s; the next is due in an hour", PURGE_TASK)


class Scheduler(SweeperMixin, PersistentScheduler):
    """Celery's default scheduler (its schedule file and `beat_schedule`) with the sweeper."""
