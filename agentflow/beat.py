"""Celery beat with the recovery sweeper in it (SPEC 3.4).

Every `AGENTFLOW_SWEEP_INTERVAL` seconds beat sweeps itself rather than sending a task: a sweep
is a few milliseconds of SQL and a handful of publishes, and run here it never waits behind a
backlog of steps, never expires unseen in a queue, and needs no worker to be free exactly when
workers are the thing that died. Recovery then stands on one process, the one `/healthz` and
`/metrics` watch through the sweeper's heartbeat. Other periodic tasks (retention) are sent to
workers as usual.

Selected in settings (`CELERY_BEAT_SCHEDULER`), so `celery -A agentflow beat` and the embedded
beat of `celery -A agentflow worker -B` both use it.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.beat import PersistentScheduler
from django.conf import settings

from agentflow import recovery

logger = logging.getLogger(__name__)

SWEEPER = "agentflow-sweeper"


class Scheduler(PersistentScheduler):
    def setup_schedule(self) -> None:
        super().setup_schedule()
        interval = float(settings.AGENTFLOW_SWEEP_INTERVAL)
        self.merge_inplace({SWEEPER: {"task": SWEEPER, "schedule": interval}})

    def apply_entry(self, entry: Any, producer: Any = None) -> None:
        if entry.name != SWEEPER:
            super().apply_entry(entry, producer=producer)
            return
        try:
            recovery.sweep()
        except Exception:  # the database is away, say: the next tick tries again
            logger.exception("sweep failed; the next one is due in %s s", entry.schedule)
