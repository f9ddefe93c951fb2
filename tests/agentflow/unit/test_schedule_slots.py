"""Which slots are due (agentflow._schedules.slots): pure arithmetic, table-driven, with the
nights a time zone changes its clocks (docs/schedules.md, "Cron and time zone")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from agentflow._schedules import slots


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def utc(*texts: str) -> list[datetime]:
    return [at(text) for text in texts]


HOUR, MINUTE = timedelta(hours=1), timedelta(minutes=1)

# cron, zone, last acted on, now, window -> (missed, to start), all UTC.
CASES = [
    pytest.param(
        "* * * * *",
        "UTC",
        "2026-12-06T10:00",
        "2026-12-06T10:03:30",
        HOUR,
        [],
        utc("2026-12-06T10:01", "2026-12-06T10:02", "2026-12-06T10:03"),
        id="every-minute-three-due",
    ),
    pytest.param(
        "* * * * *",
        "UTC",
        "2026-12-06T10:00",
        "2026-12-06T10:03:30",
        MINUTE,
        utc("2026-12-06T10:01", "2026-12-06T10:02"),
        utc("2026-12-06T10:03"),
        id="window-of-a-minute-keeps-the-newest",
    ),
    pytest.param(
        "* * * * *",
        "UTC",
        "2026-12-06T10:00",
        "2026-12-06T10:03",
        timedelta(0),
        utc("2026-12-06T10:01", "2026-12-06T10:02"),
        utc("2026-12-06T10:03"),
        id="a-slot-due-exactly-now-starts-even-with-no-window",
    ),
    pytest.param(
        "* * * * *",
        "UTC",
        "2026-12-06T10:03",
        "2026-12-06T10:03:59",
        HOUR,
        [],
        [],
        id="the-last-slot-is-never-due-again",
    ),
    pytest.param(
        "0 2 * * *",
        "UTC",
        "2026-12-05T02:00",
        "2026-12-06T02:00:05",
        HOUR,
        [],
        utc("2026-12-06T02:00"),
        id="nightly-at-two-utc",
    ),
    pytest.param(
        "0 2 * * *",
        "UTC",
        "2026-12-03T02:00",
        "2026-12-06T05:00",
        timedelta(hours=4),
        utc("2026-12-04T02:00", "2026-12-05T02:00"),
        utc("2026-12-06T02:00"),
        id="beat-down-three-nights-window-four-hours",
    ),
    pytest.param(
        "0 2 * * *",
        "Europe/Paris",
        "2026-12-05T12:00",
        "2026-12-06T01:00:10",
        HOUR,
        [],
        utc("2026-12-06T01:00"),
        id="two-in-paris-is-one-utc-in-winter",
    ),
    # 29 March 2026, Paris: 02:00-03:00 does not exist; the 02:30 slot runs at 03:00 CEST.
    pytest.param(
        "30 2 * * *",
        "Europe/Paris",
        "2026-03-27T12:00",
        "2026-03-31T00:00",
        timedelta(days=7),
        [],
        utc("2026-03-28T01:30", "2026-03-29T01:00", "2026-03-30T00:30"),
        id="spring-forward-a-missing-time-runs-once-at-three",
    ),
    # 25 October 2026, Paris: 02:00-03:00 happens twice; the 02:30 slot runs once (CEST).
    pytest.param(
        "30 2 * * *",
        "Europe/Paris",
        "2026-10-23T12:00",
        "2026-10-27T00:00",
        timedelta(days=7),
        [],
        utc("2026-10-24T00:30", "2026-10-25T00:30", "2026-10-26T01:30"),
        id="fall-back-a-repeated-time-runs-once",
    ),
    pytest.param(
        "0 * * * *",
        "Europe/Paris",
        "2026-10-24T22:10",
        "2026-10-25T02:00",
        timedelta(days=1),
        [],
        utc("2026-10-24T23:00", "2026-10-25T00:00", "2026-10-25T01:00", "2026-10-25T02:00"),
        id="fall-back-hourly-is-every-real-hour",
    ),
    pytest.param(
        "0 * * * *",
        "America/New_York",
        "2026-03-08T05:10",
        "2026-03-08T09:00",
        timedelta(days=1),
        [],
        utc("2026-03-08T06:00", "2026-03-08T07:00", "2026-03-08T08:00", "2026-03-08T09:00"),
        id="spring-forward-hourly-is-every-real-hour",
    ),
]


@pytest.mark.parametrize(("cron", "zone", "last", "now", "window", "missed", "to_start"), CASES)
def test_due__splits_slots_by_the_catch_up_window(
    cron: str,
    zone: str,
    last: str,
    now: str,
    window: timedelta,
    missed: list[datetime],
    to_start: list[datetime],
) -> None:
    due = slots.due(cron, zone, last=at(last), now=at(now), window=window)
    assert (due.missed, due.to_start) == (missed, to_start)
    assert due.last == (to_start or missed or [None])[-1]


def test_due__acts_on_at_most_the_limit_oldest_first() -> None:
    due = slots.due(
        "* * * * *",
        "UTC",
        last=at("2026-12-01T00:00"),
        now=at("2026-12-06T00:00"),
        window=HOUR,
        limit=1000,
    )
    assert len(due.missed) == 1000 and due.to_start == []
    assert due.last == at("2026-12-01T16:40")


@pytest.mark.parametrize(
    ("cron", "problem"),
    [
        ("", "needs a cron expression"),
        ("* * * *", "five fields"),
        ("* * * * * *", "five fields"),
        ("61 * * * *", "Bad minute"),
        ("0 2 30 2 *", "Bad day-of-month"),
    ],
)
def test_check_cron__names_what_is_wrong(cron: str, problem: str) -> None:
    with pytest.raises(slots.ScheduleError, match=problem):
        slots.check_cron(cron)


def test_zone__unknown_names_are_refused() -> None:
    with pytest.raises(slots.ScheduleError, match="unknown time zone 'Mars/Olympus'"):
        slots.zone("Mars/Olympus")


def test_business_key__is_the_schedule_and_the_slot_in_utc() -> None:
    slot = datetime.fromisoformat("2026-12-06T03:00+01:00")
    assert slots.business_key("nightly", slot) == "schedule:nightly:2026-12-06T02:00:00Z"
