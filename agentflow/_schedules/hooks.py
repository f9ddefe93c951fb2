"""What the schedules add to the core's rounds (docs/layout.md, "Features beside the core"):
every sweeper pass ticks the due slots, every retention tick forgets old slots, every scrape
reads their gauges, a worker that starts acts on the due slots once, and `manage.py check`
refuses a schedule that cannot run. `install()` registers them, from `AgentflowConfig.ready()`.
"""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import worker_ready
from django.core import checks
from django.db import DatabaseError

from agentflow._core import features, outage, registry
from agentflow._schedules.declaration import declared
from agentflow._schedules.slots import ScheduleError
from agentflow._schedules.store import slots_purge
from agentflow._schedules.tick import gauges, tick

#: The name a worker's start has always logged under, which hosts' LOGGING knows.
logger = logging.getLogger("agentflow.tasks")


def install() -> None:
    features.on_sweep("schedules", tick, failed="the schedules could not be ticked")
    features.on_retention(
        "schedules", lambda older_than: slots_purge(older_than=older_than), rows="schedule slots"
    )
    features.on_scrape("schedules", gauges)
    worker_ready.connect(_start_due_slots, weak=False, dispatch_uid="agentflow.schedules")
    checks.register(schedules_check)


def _start_due_slots(sender: Any, **kwargs: Any) -> None:
    """A worker that starts acts on the schedules' due slots once (docs/schedules.md): after
    an outage, the missed slots within their window start as soon as any process is back, even
    before a beat is. Beat's sweeps act on them from then on; a slot is one run whoever sees it."""
    try:
        tick()
    except DatabaseError as exc:  # the database is away: beat's sweeps try again
        if not outage.unreachable(exc):
            logger.exception("schedules: the due slots could not be acted on at start")


def schedules_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A malformed AGENTFLOW_SCHEDULES, a name declared twice, or a schedule of a workflow no
    module registers fails at deploy time, not silently at 02:00 (docs/schedules.md)."""
    try:
        found = declared()
    except ScheduleError as exc:
        return [checks.Error(str(exc), hint="See docs/schedules.md.", id="agentflow.E041")]
    known = set(registry.names())
    return [
        checks.Error(
            f"schedule {name!r} starts workflow {schedule.workflow!r}, which no module registers",
            hint="Name a registered workflow, or add its module to AGENTFLOW_WORKFLOW_MODULES.",
            id="agentflow.E041",
        )
        for name, schedule in sorted(found.items())
        if schedule.workflow not in known
    ]
