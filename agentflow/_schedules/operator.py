"""What an operator does to a schedule (docs/schedules.md, "Operators"): pause, resume, change
its cron, start one slot by hand; each by name, on the schedules' clock, recorded with who and
why. The admin page calls these; a name no process declares is refused with a clear error."""

from __future__ import annotations

from typing import Any

from agentflow._core.serialization import NotJSONError, to_json
from agentflow._schedules import clock, store
from agentflow._schedules.declaration import Schedule, declared
from agentflow._schedules.overview import ScheduleView, view
from agentflow._schedules.slots import ScheduleError
from agentflow.exceptions import UnknownWorkflowError


def schedule_named(name: str) -> Schedule:
    try:
        return declared()[name]
    except KeyError:
        raise ScheduleError(f"no schedule named {name!r} is declared") from None


def views() -> list[ScheduleView]:
    now = clock.now()
    return [view(schedule, now=now) for _, schedule in sorted(declared().items())]


def pause(name: str, *, actor: str, reason: str) -> bool:
    schedule_named(name)
    return store.schedule_pause(name, now=clock.now(), actor=actor, reason=reason)


def resume(name: str, *, actor: str, reason: str) -> bool:
    schedule_named(name)
    return store.schedule_resume(name, now=clock.now(), actor=actor, reason=reason)


def change(name: str, *, cron: str, input: dict[str, Any] | None) -> None:
    """Override the declaration's cron and input ("" / None: as declared); the next tick
    reads them, no restart. Raises ScheduleError for a cron or input that cannot be used."""
    schedule_named(name)
    if input is not None:
        if not isinstance(input, dict):
            raise ScheduleError("a schedule's input is a JSON object")
        try:
            to_json(input, "the schedule's input")
        except NotJSONError as exc:
            raise ScheduleError(str(exc)) from None
    store.schedule_change(name, now=clock.now(), cron=cron.strip(), input=input)


def trigger(name: str, *, actor: str, reason: str) -> str:
    """Start one slot now, whatever the pause and overlap say. Returns the run's id."""
    schedule = schedule_named(name)
    try:
        return store.slot_trigger(schedule, now=clock.now(), actor=actor, reason=reason)
    except store.SlotTaken as exc:
        raise ScheduleError(str(exc)) from None
    except UnknownWorkflowError as exc:
        raise ScheduleError(f"schedule {name}: {exc}") from None
