"""Durable schedules in one process (issue 41, docs/schedules.md): the overlap policies, pause
and resume, a cron changed without a restart, a slot started by hand, the operator's page and
the schedule gauges. The schedules' clock is a file the test writes (as in the acceptance
tests); runs are created but never published (no commit hook runs in these tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.test import override_settings
from django.utils import timezone

from agentflow import _schedules, durable
from agentflow._base.states import RunStatus
from agentflow._schedules import operator
from agentflow.models import ScheduleSlot, ScheduleState, WorkflowRun
from tests.support import workflows  # noqa: F401  (registers schedule_probe)
from tests.support.admin import as_user

pytestmark = pytest.mark.django_db

NAME = "probe"
BASE = datetime(2031, 5, 4, 10, 0, 30, tzinfo=UTC)
PAGE = "/admin/agentflow/schedulestate/"
Clock = Callable[[datetime], None]


def slot(k: int) -> datetime:
    return BASE.replace(second=0) + timedelta(minutes=k)


@pytest.fixture
def clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Clock:
    path = tmp_path / "clock"
    monkeypatch.setenv("AGENTFLOW_FAULTS", "1")
    monkeypatch.setenv("AGENTFLOW_SCHEDULE_CLOCK_FILE", str(path))

    def move(to: datetime) -> None:
        path.write_text(to.isoformat())

    move(BASE)
    return move


@pytest.fixture
def declare(clock: Clock) -> Iterator[Callable[..., durable.Schedule]]:
    def make(**given: object) -> durable.Schedule:
        spec: dict = {"name": NAME, "workflow": "schedule_probe", "cron": "* * * * *", **given}
        schedule = durable.Schedule(**spec)
        _schedules.tick()  # first seen at BASE: its slots are those after
        return schedule

    yield make
    _schedules.forget(NAME)


def at(k: int, clock: Clock) -> _schedules.TickReport:
    clock(slot(k) + timedelta(seconds=30))
    return _schedules.tick()


def outcome(k: int) -> tuple[str, str]:
    row = ScheduleSlot.objects.get(schedule=NAME, slot=slot(k))
    return row.outcome, row.why


def finish(k: int) -> None:
    run_id = ScheduleSlot.objects.get(schedule=NAME, slot=slot(k)).run_id
    WorkflowRun.objects.filter(pk=run_id).update(status=RunStatus.COMPLETED, wake_at=None)


def test_overlap_skip__a_slot_while_the_last_run_goes_on_is_skipped(declare, clock) -> None:
    declare(overlap="skip")
    assert len(at(1, clock).started) == 1
    at(2, clock)
    assert outcome(2) == ("skipped", "overlap")
    reason = ScheduleSlot.objects.get(schedule=NAME, slot=slot(2)).reason
    assert reason.startswith("the run of slot 2031-05-04T10:01:00Z (")
    finish(1)
    at(3, clock)
    assert outcome(3) == ("started", "cron")


def test_overlap_queue_one__one_waits_for_the_run_and_a_further_one_is_skipped(
    declare, clock
) -> None:
    declare(overlap="queue_one")
    at(1, clock)
    at(2, clock)
    at(3, clock)
    assert [outcome(2), outcome(3)] == [("queued", "overlap"), ("skipped", "overlap")]
    finish(1)
    report = at(4, clock)  # the queued slot starts first; slot 4 then waits behind it
    assert outcome(2) == ("started", "overlap") and outcome(4) == ("queued", "overlap")
    run = WorkflowRun.objects.get(pk=report.started[0])
    assert run.business_key == "schedule:probe:2031-05-04T10:02:00Z"
    assert run.input == {"scheduled_at": "2031-05-04T10:02:00Z"}


def test_overlap_run_beside__every_slot_starts(declare, clock) -> None:
    declare(overlap="run_beside", input={"region": "eu"})
    for k in (1, 2, 3):
        at(k, clock)
    assert [outcome(k) for k in (1, 2, 3)] == [("started", "cron")] * 3
    inputs = WorkflowRun.objects.filter(business_key__startswith="schedule:probe:")
    assert {run.input["region"] for run in inputs} == {"eu"}


def test_pause_and_resume__slots_meanwhile_are_skipped_with_who_and_why(declare, clock) -> None:
    declare(overlap="run_beside")
    assert operator.pause(NAME, actor="alice", reason="partner maintenance")
    assert not operator.pause(NAME, actor="alice", reason="again")
    at(1, clock)
    row = ScheduleSlot.objects.get(schedule=NAME, slot=slot(1))
    assert (row.outcome, row.why) == ("skipped", "paused")
    assert row.reason == "paused by alice: partner maintenance"
    assert operator.resume(NAME, actor="bob", reason="maintenance over")
    at(2, clock)
    assert outcome(2) == ("started", "cron")


def test_cron_changed__the_next_tick_reads_it_without_a_restart(declare, clock) -> None:
    declare(overlap="run_beside")
    at(1, clock)
    operator.change(NAME, cron="*/5 * * * *", input={"k": 1})
    for k in (2, 3, 4, 5):
        at(k, clock)
    assert list(ScheduleSlot.objects.filter(schedule=NAME).values_list("slot", flat=True)) == [
        slot(5),
        slot(1),
    ]
    assert WorkflowRun.objects.get(business_key="schedule:probe:2031-05-04T10:05:00Z").input == {
        "k": 1,
        "scheduled_at": "2031-05-04T10:05:00Z",
    }
    with pytest.raises(_schedules.ScheduleError, match="Bad minute"):
        operator.change(NAME, cron="61 * * * *", input=None)


def test_trigger__starts_one_slot_now_recorded_with_actor_and_reason(declare, clock) -> None:
    declare(overlap="skip")
    operator.pause(NAME, actor="alice", reason="quiet")
    clock(BASE + timedelta(seconds=7))
    run_id = operator.trigger(NAME, actor="carol", reason="finance asked for a rerun")
    row = ScheduleSlot.objects.get(run_id=run_id)
    assert (row.outcome, row.why, row.actor, row.reason) == (
        "started",
        "by_hand",
        "carol",
        "finance asked for a rerun",
    )
    assert WorkflowRun.objects.get(pk=run_id).business_key == "schedule:probe:2031-05-04T10:00:37Z"
    with pytest.raises(_schedules.ScheduleError, match="already has a slot"):
        operator.trigger(NAME, actor="carol", reason="twice in the same second")
    with pytest.raises(_schedules.ScheduleError, match="no schedule named 'nope'"):
        operator.trigger("nope", actor="carol", reason="?")


def test_missed_slots__skipped_and_counted_on_the_gauges(declare, clock) -> None:
    declare(catch_up=timedelta(minutes=1), overlap="run_beside")
    at(5, clock)
    assert [outcome(k)[1] for k in (1, 2, 3, 4, 5)] == ["missed"] * 4 + ["cron"]
    clock(slot(5) + timedelta(seconds=42))
    gauges = _schedules.gauges()
    assert gauges["agentflow_schedule_missed_slots"][(NAME,)] == 4.0
    assert gauges["agentflow_schedule_seconds_since_last_slot"][(NAME,)] == 12.0


def test_page__lists_schedules_and_acts_under_its_own_permissions(declare, clock) -> None:
    declare(overlap="skip")
    at(1, clock)
    at(2, clock)

    page = as_user("watcher", ["agentflow.view_schedulestate"]).get(PAGE)
    text = page.content.decode()
    assert page.status_code == 200
    assert "probe" in text and "schedule_probe" in text and "2031-05-04 10:03" in text  # next
    assert "The previous slot&#x27;s run had not finished" in text  # slot 2, skipped and why
    assert "Start a slot now" not in text and "Pause" not in text

    refused = as_user("pauser", ["agentflow.pause_schedulestate"]).post(
        f"{PAGE}probe/trigger/", {"reason": "try"}
    )
    assert refused.status_code == 403
    starter = as_user("starter", ["agentflow.trigger_schedulestate"])
    done = starter.post(f"{PAGE}probe/trigger/", {"reason": "by hand"}, follow=True)
    assert "a slot started now" in done.content.decode()
    assert ScheduleSlot.objects.filter(why="by_hand", actor="starter", reason="by hand").exists()
    no_reason = starter.post(f"{PAGE}probe/trigger/", {"reason": ""}, follow=True)
    assert "Give the reason" in no_reason.content.decode()

    pauser = as_user("pauser2", ["agentflow.pause_schedulestate"])
    pauser.post(f"{PAGE}probe/pause/", {"reason": "audit"})
    assert ScheduleState.objects.get(name=NAME).paused
    bad = pauser.post(f"{PAGE}probe/change/", {"reason": "x", "cron": "nonsense"}, follow=True)
    assert "five fields" in bad.content.decode()


@override_settings(AGENTFLOW_SCHEDULES='{"broken": {"workflow": "x", "cron": "nope"}}')
def test_bad_settings__said_on_the_tick_and_the_page_never_a_traceback(clock) -> None:
    report = _schedules.tick()
    assert report.errors == [
        "cron 'nope': five fields (minute hour day-of-month month day-of-week)"
    ]
    page = as_user("root", superuser=True).get(PAGE)
    assert page.status_code == 200 and "five fields" in page.content.decode()


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ('{"nightly": {"workflow": "schedule_probe", "cron": "0 2 * *"}}', "five fields"),
        ('{"nightly": {"workflow": "no_such_flow", "cron": "0 2 * * *"}}', "which no module"),
        (
            '{"nightly": {"workflow": "schedule_probe", "cron": "0 2 * * *", "when": 1}}',
            "unknown keys when",
        ),
        ("{not json", "not JSON"),
    ],
)
def test_system_check__a_schedule_that_cannot_run_fails_at_deploy(value: str, problem: str) -> None:
    from agentflow._schedules.hooks import schedules_check

    with override_settings(AGENTFLOW_SCHEDULES=value):
        [error] = schedules_check()
    assert error.id == "agentflow.E041" and problem in error.msg


def test_retention__old_slots_are_forgotten_and_the_schedule_goes_on(declare, clock) -> None:
    declare(overlap="run_beside")
    at(1, clock)
    at(2, clock)
    # Recorded by the database's clock (retention's), not the schedules' test clock.
    old = timezone.now() - timedelta(days=40)
    ScheduleSlot.objects.filter(slot=slot(1)).update(recorded_at=old)

    assert _schedules.slots_purge(older_than=timedelta(days=30)) == 1

    at(3, clock)  # the schedule's row still knows its last slot: nothing is acted on twice
    assert sorted(ScheduleSlot.objects.values_list("slot", flat=True)) == [slot(2), slot(3)]
