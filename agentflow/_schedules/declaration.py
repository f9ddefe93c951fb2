"""Schedules as code and settings declare them (docs/schedules.md): which workflow, when, with
what input, how far back a missed slot is still started, and what a slot does while the
previous one's run goes on.

A declaration is a value: operators' changes (pause, a new cron, a new input) live in the
schedule's row (`ScheduleState`), read on every tick, so none needs a restart.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from agentflow._conf import settings
from agentflow._core.serialization import NotJSONError, to_json
from agentflow._schedules.slots import ScheduleError, check_cron, zone

#: What a slot does while the run of the previous slot has not finished (Temporal's overlap
#: policies, by the names an operator reads): skip it; queue it (one at most: a further slot
#: meanwhile is skipped), to start when that run finishes; or start it beside.
OVERLAPS = ("skip", "queue_one", "run_beside")
#: A name fits the run's business key (`schedule:<name>:<slot>`, at most 200 characters).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,149}")
#: By default a slot missed while nothing ran still starts within this long after its time.
DEFAULT_CATCH_UP = timedelta(hours=1)


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """Run `workflow` at each slot of `cron` (five fields, read in `time_zone`).

    Each slot starts exactly one run, whichever beat or sweeper notices it first; its input is
    `input` with `"scheduled_at"` (the slot, ISO 8601 UTC) added. A slot missed while nothing
    ran starts once on recovery if it is at most `catch_up` old, else it is recorded as
    skipped. `overlap`: "skip", "queue_one" or "run_beside" (see OVERLAPS).
    """

    name: str
    workflow: str
    cron: str
    time_zone: str = "UTC"
    input: dict[str, Any] = field(default_factory=dict)
    catch_up: timedelta = DEFAULT_CATCH_UP
    overlap: str = "skip"
    #: "code" (kept as this process's on construction, as `durable.Workflow` registers
    #: itself) or "settings" (AGENTFLOW_SCHEDULES, read on each tick).
    declared_in: str = field(default="code", compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME.fullmatch(self.name):
            raise ScheduleError(
                f"schedule name {self.name!r}: 1-150 letters, digits, _ . : - (it is part of "
                "each run's business key)"
            )
        if not isinstance(self.workflow, str) or not self.workflow:
            raise ScheduleError(f"schedule {self.name}: name the workflow it starts")
        check_cron(self.cron)
        zone(self.time_zone)
        if not isinstance(self.input, dict):
            raise ScheduleError(f"schedule {self.name}: its input is a JSON object (a dict)")
        try:
            to_json(self.input, f"schedule {self.name}'s input")
        except NotJSONError as exc:
            raise ScheduleError(str(exc)) from None
        if not isinstance(self.catch_up, timedelta) or self.catch_up < timedelta(0):
            raise ScheduleError(f"schedule {self.name}: catch_up is a timedelta, 0 or more")
        if self.overlap not in OVERLAPS:
            allowed = ", ".join(OVERLAPS)
            raise ScheduleError(
                f"schedule {self.name}: overlap {self.overlap!r} is not one of {allowed}"
            )
        if self.declared_in == "code":
            declare(self)


_in_code: dict[str, Schedule] = {}


def declare(schedule: Schedule) -> Schedule:
    """Keep `schedule` among this process's schedules (its module imported twice declares the
    same value again, which is harmless)."""
    known = _in_code.get(schedule.name)
    if known is not None and known != schedule:
        raise ScheduleError(f"schedule {schedule.name!r} declared twice, differently")
    _in_code[schedule.name] = schedule
    return schedule


def forget(name: str) -> None:
    """For tests that declare a schedule for themselves."""
    _in_code.pop(name, None)


def from_settings() -> dict[str, Schedule]:
    """AGENTFLOW_SCHEDULES (a dict, or the same as JSON): name -> {"workflow", "cron",
    "time_zone", "input", "catch_up_seconds", "overlap"}."""
    raw = settings.AGENTFLOW_SCHEDULES
    if isinstance(raw, str):  # from the environment, as JSON ("" for none)
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            raise ScheduleError(f"AGENTFLOW_SCHEDULES is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ScheduleError("AGENTFLOW_SCHEDULES is a dict: name -> {workflow, cron, ...}")
    found: dict[str, Schedule] = {}
    for name, spec in raw.items():
        if not isinstance(spec, dict):
            raise ScheduleError(f"AGENTFLOW_SCHEDULES[{name!r}] is a dict")
        unknown = set(spec) - {
            "workflow",
            "cron",
            "time_zone",
            "input",
            "catch_up_seconds",
            "overlap",
        }
        if unknown:
            raise ScheduleError(
                f"AGENTFLOW_SCHEDULES[{name!r}]: unknown keys {', '.join(sorted(unknown))}"
            )
        seconds = spec.get("catch_up_seconds", DEFAULT_CATCH_UP.total_seconds())
        if not isinstance(seconds, int | float) or isinstance(seconds, bool):
            raise ScheduleError(f"AGENTFLOW_SCHEDULES[{name!r}]: catch_up_seconds is a number")
        found[name] = Schedule(
            name=name,
            workflow=spec.get("workflow", ""),
            cron=spec.get("cron", ""),
            time_zone=spec.get("time_zone", "UTC"),
            input=spec.get("input", {}),
            catch_up=timedelta(seconds=seconds),
            overlap=spec.get("overlap", "skip"),
            declared_in="settings",
        )
    return found


def declared() -> dict[str, Schedule]:
    """Every schedule of this process, from code and settings, by name."""
    hosted = from_settings()
    both = sorted(set(hosted) & set(_in_code))
    if both:
        raise ScheduleError(
            f"schedules declared both in code and in AGENTFLOW_SCHEDULES: {', '.join(both)}"
        )
    return {**_in_code, **hosted}
