"""What operators and /metrics read about each schedule (docs/schedules.md): its last and next
slots, the runs of its recent slots, the slots it skipped and why."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count

from agentflow._schedules import slots
from agentflow._schedules.declaration import Schedule
from agentflow.models import ScheduleSlot, ScheduleState, WorkflowRun

#: Recent slots shown per schedule on its page.
RECENT_SLOTS = 10


@dataclass(frozen=True, kw_only=True)
class ScheduleView:
    schedule: Schedule
    #: The cron in force: the operator's override, or the declaration's.
    cron: str
    overridden: bool
    paused: bool
    pause_reason: str
    last_slot: datetime | None
    last_started_at: datetime | None
    next_slot: datetime | None
    #: (slot row, the status of its run or "") for the latest slots, newest first.
    recent: list[tuple[ScheduleSlot, str]]
    skipped: list[ScheduleSlot]
    missed_total: int


def view(schedule: Schedule, *, now: datetime) -> ScheduleView:
    state = ScheduleState.objects.filter(name=schedule.name).first()
    cron = (state.cron if state is not None and state.cron else "") or schedule.cron
    start = max(now, state.last_slot) if state is not None and state.last_slot else now
    rows = ScheduleSlot.objects.filter(schedule=schedule.name)
    recent = list(rows.order_by("-slot")[:RECENT_SLOTS])
    statuses = dict(
        WorkflowRun.objects.filter(pk__in=[r.run_id for r in recent if r.run_id]).values_list(
            "id", "status"
        )
    )
    return ScheduleView(
        schedule=schedule,
        cron=cron,
        overridden=cron != schedule.cron,
        paused=bool(state and state.paused),
        pause_reason=state.pause_reason if state is not None else "",
        last_slot=state.last_slot if state is not None else None,
        last_started_at=state.last_started_at if state is not None else None,
        next_slot=slots.next_slot(cron, schedule.time_zone, start),
        recent=[(row, str(statuses.get(row.run_id, ""))) for row in recent],
        skipped=list(
            rows.filter(outcome=ScheduleSlot.Outcome.SKIPPED).order_by("-slot")[:RECENT_SLOTS]
        ),
        missed_total=rows.filter(why=ScheduleSlot.Why.MISSED).count(),
    )


def gauges(schedules: dict[str, Schedule], *, now: datetime) -> dict[str, Any]:
    """/metrics' schedule gauges: seconds since each one's last slot started (+Inf: never),
    and its slots skipped as missed (older than the catch-up window when seen)."""
    started = dict(
        ScheduleState.objects.filter(name__in=list(schedules)).values_list(
            "name", "last_started_at"
        )
    )
    missed = {name: 0.0 for name in schedules}
    counted = (
        ScheduleSlot.objects.filter(schedule__in=list(schedules), why=ScheduleSlot.Why.MISSED)
        .order_by()
        .values_list("schedule")
        .annotate(n=Count("pk"))
    )
    missed.update((name, float(n)) for name, n in counted)
    return {
        "agentflow_schedule_seconds_since_last_slot": {
            (name,): (now - at).total_seconds() if (at := started.get(name)) else math.inf
            for name in schedules
        },
        "agentflow_schedule_missed_slots": {(name,): n for name, n in missed.items()},
    }
