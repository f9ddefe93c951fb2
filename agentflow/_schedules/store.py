"""The only code that writes schedule rows (`ScheduleState`, `ScheduleSlot`): a tick's slots,
an operator's pause, resume, change and start by hand (docs/schedules.md).

A tick locks the schedule's row (SKIP LOCKED: whoever holds it is acting on the same slots),
records each due slot (unique per schedule and slot) and starts its run in the same commit,
under the business key `schedule:<name>:<slot>`; the run's first step is published when that
commit lands. So a slot is acted on once however many beats and sweepers tick, and a process
killed before its commit leaves the slot due for the next one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from agentflow import _store as store
from agentflow._base.states import TERMINAL_RUN_STATUSES
from agentflow._core import faults, registry
from agentflow._schedules import slots
from agentflow._schedules.declaration import Schedule
from agentflow.models import ScheduleSlot, ScheduleState, WorkflowRun

Outcome = ScheduleSlot.Outcome
Why = ScheduleSlot.Why


@dataclass
class Acted:
    """What one tick did for one schedule: the runs it started (for the caller to report once
    the commit landed) and how many slots it skipped."""

    started: list[tuple[datetime, str]] = field(default_factory=list)
    queued: list[datetime] = field(default_factory=list)
    skipped: list[datetime] = field(default_factory=list)


def state_ensure(name: str, now: datetime) -> None:
    """The schedule's row, made on first sight with `since` = now: it never backfills the time
    before anyone knew of it."""
    ScheduleState.objects.get_or_create(name=name, defaults={"since": now})


def slots_act(schedule: Schedule, *, now: datetime) -> Acted:
    """Record and start the slots of `schedule` due by `now` (see the module's docstring)."""
    acted = Acted()
    state_ensure(schedule.name, now)
    with transaction.atomic():
        state = (
            ScheduleState.objects.select_for_update(skip_locked=True)
            .filter(name=schedule.name)
            .first()
        )
        if state is None:
            return acted  # another beat or sweeper is acting on this schedule now
        _queued_go(schedule, state, now, acted)
        due = slots.due(
            state.cron or schedule.cron,
            schedule.time_zone,
            last=state.last_slot or state.since,
            now=now,
            window=schedule.catch_up,
        )
        if due.last is None:
            return acted
        faults.schedule_crash_point("slot_due")
        for slot in due.missed:
            reason = f"missed by more than the catch-up window ({schedule.catch_up})"
            _record(schedule.name, slot, Outcome.SKIPPED, Why.MISSED, reason=reason)
            acted.skipped.append(slot)
        for slot in due.to_start:
            _slot_due(schedule, state, slot, now, acted)
        state.last_slot = due.last
        state.save(update_fields=["last_slot", "last_started_at", "updated_at"])
    return acted


def _slot_due(
    schedule: Schedule, state: ScheduleState, slot: datetime, now: datetime, acted: Acted
) -> None:
    """One slot in the window: started, queued or skipped, by the pause and overlap policy."""
    if state.paused:
        _record(schedule.name, slot, Outcome.SKIPPED, Why.PAUSED, reason=state.pause_reason)
        acted.skipped.append(slot)
        return
    previous = _running_slot(schedule.name)
    if previous is None or schedule.overlap == "run_beside":
        acted.started.append((slot, _start(schedule, state, slot, Why.CRON, now=now)))
        return
    busy = f"the run of slot {slots.iso(previous.slot)} ({previous.run_id}) had not finished"
    waiting = ScheduleSlot.objects.filter(schedule=schedule.name, outcome=Outcome.QUEUED)
    if schedule.overlap == "queue_one" and not waiting.exists():
        _record(schedule.name, slot, Outcome.QUEUED, Why.OVERLAP, reason=busy)
        acted.queued.append(slot)
        return
    if schedule.overlap == "queue_one":
        busy += "; one slot was already queued"
    _record(schedule.name, slot, Outcome.SKIPPED, Why.OVERLAP, reason=busy)
    acted.skipped.append(slot)


def _queued_go(schedule: Schedule, state: ScheduleState, now: datetime, acted: Acted) -> None:
    """The slot queued behind a run that has now finished starts (overlap "queue_one")."""
    queued = ScheduleSlot.objects.filter(schedule=schedule.name, outcome=Outcome.QUEUED).first()
    if queued is None or state.paused or _running_slot(schedule.name) is not None:
        return
    run_id = _run_create(schedule, state, queued.slot)
    ScheduleSlot.objects.filter(pk=queued.pk).update(outcome=Outcome.STARTED, run_id=run_id)
    state.last_started_at = now
    state.save(update_fields=["last_started_at", "updated_at"])
    acted.started.append((queued.slot, run_id))


def _running_slot(name: str) -> ScheduleSlot | None:
    """The latest started slot whose run has not finished."""
    latest = (
        ScheduleSlot.objects.filter(schedule=name, outcome=Outcome.STARTED)
        .order_by("-slot")
        .first()
    )
    if latest is None:
        return None
    finished = WorkflowRun.objects.filter(pk=latest.run_id, status__in=TERMINAL_RUN_STATUSES)
    gone = not WorkflowRun.objects.filter(pk=latest.run_id).exists()
    return None if gone or finished.exists() else latest


def _start(
    schedule: Schedule,
    state: ScheduleState,
    slot: datetime,
    why: str,
    *,
    now: datetime,
    actor: str = "",
    reason: str = "",
) -> str:
    run_id = _run_create(schedule, state, slot)
    _record(schedule.name, slot, Outcome.STARTED, why, run_id=run_id, actor=actor, reason=reason)
    state.last_started_at = now
    return run_id


def _run_create(schedule: Schedule, state: ScheduleState, slot: datetime) -> str:
    given: dict[str, Any] = state.input if isinstance(state.input, dict) else schedule.input
    run_id, _ = store.run_create(
        workflow=registry.latest(schedule.workflow),
        input={**given, "scheduled_at": slots.iso(slot)},
        business_key=slots.business_key(schedule.name, slot),
    )
    return run_id


def _record(
    name: str,
    slot: datetime,
    outcome: str,
    why: str,
    *,
    run_id: str = "",
    actor: str = "",
    reason: str = "",
) -> None:
    ScheduleSlot.objects.create(
        schedule=name,
        slot=slot,
        outcome=outcome,
        why=why,
        run_id=run_id,
        actor=actor,
        reason=reason,
    )


# --- an operator's actions ----------------------------------------------------------------------


class SlotTaken(Exception):
    """The instant given already has its slot (started, queued or skipped)."""


def slot_trigger(schedule: Schedule, *, now: datetime, actor: str, reason: str) -> str:
    """Start one slot now, by hand, whatever the pause and the overlap policy say; recorded
    with `actor` and `reason`. Returns the run's id."""
    slot = now.replace(microsecond=0)
    state_ensure(schedule.name, now)
    try:
        with transaction.atomic():
            state = ScheduleState.objects.select_for_update().get(name=schedule.name)
            run_id = _start(schedule, state, slot, Why.BY_HAND, now=now, actor=actor, reason=reason)
            state.save(update_fields=["last_started_at", "updated_at"])
    except IntegrityError:
        raise SlotTaken(f"{schedule.name} already has a slot at {slots.iso(slot)}") from None
    return run_id


def schedule_pause(name: str, *, now: datetime, actor: str, reason: str) -> bool:
    """Pause: each slot that falls due meanwhile is recorded as skipped ("paused"). False if it
    was paused already."""
    state_ensure(name, now)
    return bool(
        ScheduleState.objects.filter(name=name, paused=False).update(
            paused=True, paused_by=actor, pause_reason=f"paused by {actor}: {reason}"
        )
    )


def schedule_resume(name: str, *, now: datetime, actor: str, reason: str) -> bool:
    """Resume: slots from here on start again. False if it was not paused."""
    state_ensure(name, now)
    return bool(
        ScheduleState.objects.filter(name=name, paused=True).update(
            paused=False, paused_by=actor, pause_reason=f"resumed by {actor}: {reason}"
        )
    )


def schedule_change(name: str, *, now: datetime, cron: str, input: dict[str, Any] | None) -> None:
    """Set (or with "" / None, clear) the cron and input overrides: the next tick reads them.
    The new cron's slots count from now: none before the change is caught up."""
    if cron:
        slots.check_cron(cron)
    state_ensure(name, now)
    ScheduleState.objects.filter(name=name).update(cron=cron, input=input, last_slot=now)


def slots_purge(*, older_than: timedelta) -> int:
    """Forget slots recorded longer ago than `older_than` (retention, as for finished runs);
    each schedule's own row keeps its last slot, so none is ever acted on again."""
    deleted, _ = ScheduleSlot.objects.filter(
        recorded_at__lt=Now() - older_than, outcome__in=[Outcome.STARTED, Outcome.SKIPPED]
    ).delete()
    return deleted
