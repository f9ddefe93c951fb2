"""Durable schedules with real processes (issue 41, docs/schedules.md): each slot exactly one
run however many beats tick, missed slots caught up within the window and skipped beyond it,
a beat SIGKILLed at the moment a slot is due.

Time: every process's schedules read "now" from the file AGENTFLOW_SCHEDULE_CLOCK_FILE names
(honoured only with AGENTFLOW_FAULTS=1, agentflow._core.faults.schedule_clock). The test moves that
instant from slot to slot and waits for what each beat does, so ten minutely slots take
seconds, and no step depends on how fast the machine is. Everything else (leases, the sweeper,
the runs) keeps the database's clock. The schedule itself comes from AGENTFLOW_SCHEDULES in
the processes' environment: the host-setting way of declaring one.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agentflow._base.states import RunStatus
from agentflow.models import ScheduleSlot, ScheduleState, WorkflowRun
from agentflow.testing.waiting import wait_for
from tests.support import partner
from tests.support.processes import Workers, log_has

pytestmark = pytest.mark.django_db(transaction=True)

NAME = "every_minute"
#: 30 s past a minute: the slot of that minute is due, the next is not.
BASE = datetime(2031, 5, 4, 10, 0, 30, tzinfo=UTC)
#: Generous for a loaded machine: a beat ticks every second here.
SLOW = 90.0


def slot(k: int) -> datetime:
    """The k-th slot after BASE (BASE's own minute is before the schedule was first seen)."""
    return BASE.replace(second=0) + timedelta(minutes=k)


def schedule_env(clock: Path, *, window_seconds: float = 3600) -> dict[str, str]:
    spec = {
        NAME: {
            "workflow": "schedule_probe",
            "cron": "* * * * *",
            "catch_up_seconds": window_seconds,
            "overlap": "run_beside",
        }
    }
    return {
        "AGENTFLOW_FAULTS": "1",
        "AGENTFLOW_SCHEDULE_CLOCK_FILE": str(clock),
        "AGENTFLOW_SCHEDULES": json.dumps(spec),
        "AGENTFLOW_SWEEP_INTERVAL": "1",
    }


@pytest.fixture
def clock(tmp_path: Path) -> Callable[[datetime], None]:
    path = tmp_path / "schedule-clock"
    path.write_text(BASE.isoformat())

    def move(to: datetime) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(to.isoformat())
        tmp.replace(path)  # atomic: a beat never reads half an instant

    move.path = path  # type: ignore[attr-defined]
    return move


def seen_by_a_beat() -> ScheduleState:
    return wait_for(
        lambda: ScheduleState.objects.filter(name=NAME).first(),
        timeout=SLOW,
        what="a beat to see the schedule",
    )


def slot_recorded(at: datetime) -> ScheduleSlot:
    return wait_for(
        lambda: ScheduleSlot.objects.filter(schedule=NAME, slot=at).first(),
        timeout=SLOW,
        what=f"slot {at:%H:%M} to be recorded",
    )


def scheduled_runs() -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(business_key__startswith=f"schedule:{NAME}:"))


def all_finished(expected: int) -> list[WorkflowRun]:
    def done() -> list[WorkflowRun] | None:
        runs = scheduled_runs()
        if len(runs) >= expected and all(r.status == RunStatus.COMPLETED for r in runs):
            return runs
        return None

    return wait_for(done, timeout=SLOW, interval=0.2, what=f"{expected} runs to complete")


def assert_one_run_per_slot(runs: list[WorkflowRun], slots: list[datetime]) -> None:
    keys = Counter(run.business_key for run in runs)
    expected = {f"schedule:{NAME}:{at:%Y-%m-%dT%H:%M:%SZ}" for at in slots}
    assert set(keys) == expected and set(keys.values()) == {1}, keys
    for run in runs:
        assert run.input["scheduled_at"] == run.business_key.removeprefix(f"schedule:{NAME}:")
        [execution] = partner.executions(run.id)  # its one step ran once
        assert execution["step"] == "slot"


def test_two_beats_and_two_workers__ten_slots_are_exactly_ten_runs(
    workers: Workers, clock: Callable[[datetime], None]
) -> None:
    env = schedule_env(clock.path)  # type: ignore[attr-defined]
    first = workers.start(beat=True, **env)
    second = workers.start(beat=True, **env)
    seen_by_a_beat()
    slots = [slot(k) for k in range(1, 11)]
    for at in slots:
        clock(at + timedelta(seconds=30))
        assert slot_recorded(at).outcome == ScheduleSlot.Outcome.STARTED

    runs = all_finished(10)

    assert_one_run_per_slot(runs, slots)
    assert ScheduleSlot.objects.filter(schedule=NAME).count() == 10
    assert first.alive() and second.alive()


@pytest.mark.parametrize(("window_seconds", "caught_up"), [(3600, 3), (60, 1)])
def test_everything_stopped_across_three_slots__caught_up_within_the_window(
    workers: Workers,
    clock: Callable[[datetime], None],
    window_seconds: float,
    caught_up: int,
) -> None:
    env = schedule_env(clock.path, window_seconds=window_seconds)  # type: ignore[attr-defined]
    worker = workers.start(beat=True, **env)
    seen_by_a_beat()
    clock(slot(1) + timedelta(seconds=30))
    slot_recorded(slot(1))
    all_finished(1)  # killed mid-step, its step would rightly run again on restart
    worker.kill()  # beat and worker: nothing runs across the next three slots

    clock(slot(4) + timedelta(seconds=30))
    workers.start(beat=True, **env)
    slot_recorded(slot(4))

    missed = [slot(2), slot(3), slot(4)]
    started = missed[len(missed) - caught_up :]
    runs = all_finished(1 + caught_up)
    assert_one_run_per_slot(runs, [slot(1), *started])
    for at in missed[: len(missed) - caught_up]:
        skipped = ScheduleSlot.objects.get(schedule=NAME, slot=at)
        assert skipped.outcome == ScheduleSlot.Outcome.SKIPPED
        assert skipped.why == ScheduleSlot.Why.MISSED
        assert skipped.reason == "missed by more than the catch-up window (0:01:00)"
    assert ScheduleSlot.objects.filter(schedule=NAME).count() == 4


def test_beat_sigkilled_when_a_slot_is_due__the_slot_still_runs_once(
    workers: Workers, clock: Callable[[datetime], None]
) -> None:
    env = schedule_env(clock.path)  # type: ignore[attr-defined]
    doomed = workers.start(beat=True, AGENTFLOW_CRASH_AT="schedule:slot_due", **env)
    seen_by_a_beat()
    clock(slot(1) + timedelta(seconds=30))
    crashed = "fault injection: SIGKILL at schedule:slot_due"
    wait_for(lambda: log_has(doomed, crashed), timeout=SLOW, what="the beat to die")
    assert not ScheduleSlot.objects.filter(schedule=NAME).exists()  # nothing committed

    workers.start(beat=True, **env)  # another beat (the doomed worker's own is dead)

    assert slot_recorded(slot(1)).outcome == ScheduleSlot.Outcome.STARTED
    assert_one_run_per_slot(all_finished(1), [slot(1)])


def test_a_worker_back_before_any_beat__starts_the_missed_slots_once(
    workers: Workers, clock: Callable[[datetime], None]
) -> None:
    env = schedule_env(clock.path)  # type: ignore[attr-defined]
    first = workers.start(beat=True, **env)
    seen_by_a_beat()
    first.kill()
    clock(slot(2) + timedelta(seconds=30))

    workers.start(beat=False, **env)  # no beat anywhere: the worker acts on them as it starts

    assert slot_recorded(slot(2)).outcome == ScheduleSlot.Outcome.STARTED
    assert_one_run_per_slot(all_finished(2), [slot(1), slot(2)])
