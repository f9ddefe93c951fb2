"""The tick that turns due slots into runs (docs/schedules.md), called by every recovery sweep:
in beat (`agentflow.beat`) each AGENTFLOW_SWEEP_INTERVAL, and by `manage.py sweep`. No process
of its own: whichever sweeps first starts the slot, and the others find it recorded."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db import DatabaseError

from agentflow import _store as store
from agentflow._core import outage
from agentflow._observe import telemetry
from agentflow._schedules import clock, overview
from agentflow._schedules.declaration import declared
from agentflow._schedules.slots import ScheduleError, iso
from agentflow._schedules.store import slots_act
from agentflow.exceptions import UnknownWorkflowError

logger = logging.getLogger(__name__)


@dataclass
class TickReport:
    started: list[str] = field(default_factory=list)
    skipped: int = 0
    errors: list[str] = field(default_factory=list)


def tick() -> TickReport:
    """One pass over every declared schedule; one that fails (an unknown workflow, a bad row)
    is logged and spoils none of the others."""
    report = TickReport()
    try:
        schedules = declared()
    except ScheduleError as exc:
        logger.error("schedules: %s; none is ticked until this is fixed", exc)
        report.errors.append(str(exc))
        return report
    if not schedules:
        return report
    now = clock.now()  # the sweep that calls this closed stale connections first
    for schedule in schedules.values():
        try:
            acted = slots_act(schedule, now=now)
        except (ScheduleError, UnknownWorkflowError) as exc:
            logger.error("schedule %s: %s", schedule.name, exc)
            report.errors.append(f"{schedule.name}: {exc}")
            continue
        except DatabaseError as exc:
            if outage.unreachable(exc):
                raise  # the whole pass failed: its caller says so, once per outage
            logger.exception("schedule %s: its slots could not be acted on", schedule.name)
            report.errors.append(f"{schedule.name}: {exc}")
            continue
        for slot, run_id in acted.started:
            telemetry.run_started(run_id, schedule.workflow, keep_trace=store.trace_parent_record)
            logger.info("schedule %s: slot %s started run %s", schedule.name, iso(slot), run_id)
            report.started.append(run_id)
        for slot in acted.queued:
            logger.info(
                "schedule %s: slot %s queued behind the running one", schedule.name, iso(slot)
            )
        if acted.skipped:
            logger.warning(
                "schedule %s: %d slot(s) skipped (see its admin page for why)",
                schedule.name,
                len(acted.skipped),
            )
        report.skipped += len(acted.skipped)
    return report


def gauges() -> dict[str, dict[tuple[str, ...], float]]:
    """/metrics' schedule gauges, by the schedules' clock (`overview.gauges`); none while no
    schedule is declared, or while AGENTFLOW_SCHEDULES cannot be read (the tick says why)."""
    try:
        schedules = declared()
    except ScheduleError:
        return {}
    return overview.gauges(schedules, now=clock.now()) if schedules else {}
