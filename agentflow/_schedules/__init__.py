"""Durable schedules (docs/schedules.md): a workflow started at each slot of a cron expression,
each slot exactly one run whichever beat or sweeper sees it first, missed slots caught up within
a window, operators' pause, resume and start by hand. Adopters declare them through
`agentflow.durable.Schedule`; this package is the engine's side."""

from __future__ import annotations

from agentflow._schedules.declaration import OVERLAPS, Schedule, declare, declared, forget
from agentflow._schedules.slots import ScheduleError, business_key
from agentflow._schedules.store import slots_purge
from agentflow._schedules.tick import TickReport, gauges, tick

__all__ = [
    "OVERLAPS",
    "Schedule",
    "ScheduleError",
    "TickReport",
    "business_key",
    "declare",
    "declared",
    "forget",
    "gauges",
    "slots_purge",
    "tick",
]
