"""Which slots of a cron schedule are due, pure arithmetic on datetimes (docs/schedules.md).

A slot is an instant: the cron expression is read in the schedule's time zone by `cronsim`,
which decides the wall-clock questions (a 02:30 that does not exist on a spring-forward night
runs at 03:00; an hour that happens twice in autumn runs once), and every slot is kept and
compared in UTC. Nothing here reads a clock or the database: the tick hands in "now".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from agentflow.exceptions import ScheduleError

#: The most slots one tick acts on for one schedule: a schedule down for a year at one slot a
#: minute is caught up over many ticks, each a bounded transaction.
MAX_SLOTS_PER_TICK = 1000


@dataclass(frozen=True, kw_only=True)
class Due:
    """The slots after the last one acted on, up to now, split by the catch-up window."""

    #: Older than the window: recorded as skipped, never run.
    missed: list[datetime] = field(default_factory=list)
    #: Within the window (the latest is the one due now): each starts once.
    to_start: list[datetime] = field(default_factory=list)

    @property
    def last(self) -> datetime | None:
        slots = self.to_start or self.missed
        return slots[-1] if slots else None


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"unknown time zone {name!r} (an IANA name: UTC, Europe/Paris)"
        ) from None


def check_cron(cron: str) -> None:
    """Raise ScheduleError naming what is wrong with `cron`."""
    if not isinstance(cron, str) or not cron.strip():
        raise ScheduleError("a schedule needs a cron expression (minute hour day month weekday)")
    if len(cron.split()) != 5:
        raise ScheduleError(
            f"cron {cron!r}: five fields (minute hour day-of-month month day-of-week)"
        )
    try:
        CronSim(cron, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise ScheduleError(f"cron {cron!r}: {exc}") from None


def after(cron: str, time_zone: str, start: datetime) -> Iterator[datetime]:
    """Slots strictly after `start`, in order, in UTC."""
    local = start.astimezone(zone(time_zone))
    for slot in CronSim(cron, local):
        slot_utc = slot.astimezone(UTC)
        if slot_utc > start:  # cronsim starts at the next minute; never the same instant
            yield slot_utc


def next_slot(cron: str, time_zone: str, start: datetime) -> datetime:
    return next(after(cron, time_zone, start))


def due(
    cron: str,
    time_zone: str,
    *,
    last: datetime,
    now: datetime,
    window: timedelta,
    limit: int = MAX_SLOTS_PER_TICK,
) -> Due:
    """The slots in (`last`, `now`], at most `limit` of them (the oldest first), split into
    those older than `now - window` (missed) and the rest (to start)."""
    missed: list[datetime] = []
    to_start: list[datetime] = []
    oldest_kept = now - window
    for slot in after(cron, time_zone, last):
        if slot > now or len(missed) + len(to_start) >= limit:
            break
        (to_start if slot >= oldest_kept else missed).append(slot)
    return Due(missed=missed, to_start=to_start)


def business_key(schedule: str, slot: datetime) -> str:
    """`schedule:<name>:<slot in UTC, ISO 8601>`: the run's business key, so each slot is at
    most one run whichever process starts it (durable.start is idempotent on it)."""
    return f"schedule:{schedule}:{iso(slot)}"


def iso(slot: datetime) -> str:
    return slot.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
