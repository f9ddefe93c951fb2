"""The run timeline: rows in, spans and marks out, drawn as SVG whose elements we assert on."""

from __future__ import annotations

import pytest

from agentflow.admin import timeline, timeline_svg
from agentflow.admin.timeline import MarkKind, Outcome
from agentflow.models import RunEvent
from tests.support.timelines import (
    REFUND_STEPS,
    SVG,
    Rows,
    at,
    box,
    eight_retries_run,
    elements,
    iso,
    new_run,
    svg_root,
    ten_step_run,
    texts,
    title,
)


def draw(rows: Rows, *, now: float | None = None) -> str:
    drawn = timeline.build(
        rows.run,
        rows.steps,
        rows.events,
        now=at(now) if now is not None else rows.run.updated_at,
        waits=rows.waits,
    )
    return str(timeline_svg.render(drawn))


def test_ten_step_run__one_lane_and_one_completed_bar_per_step_in_order() -> None:
    svg = draw(ten_step_run())

    lanes = elements(svg, "af-tl-lane")
    attempts = elements(svg, "af-tl-attempt")
    assert [lane.get("data-step") for lane in lanes] == list(REFUND_STEPS)
    assert [a.get("data-outcome") for a in attempts] == ["completed"] * 10
    starts = [box(a)[0] for a in attempts]
    assert starts == sorted(starts) and len(set(starts)) == 10  # one shared axis, in order
    assert all(box(a)[1] - box(a)[0] >= timeline_svg.MIN_BAR_W for a in attempts)
    assert not elements(svg, "af-tl-wait") and not elements(svg, "af-tl-gap")
    # Words as well as colour: the summary column, the legend, the hover titles.
    assert texts(svg, "af-tl-summary")[:2] == ["✓ completed · 20 ms", "✓ completed · 250 ms"]
    assert "✓ completed" in "".join(svg_root(svg).find(".//*[@class='af-tl-legend']").itertext())
    assert "12:00:00.050 → 12:00:00.070 (20 ms)" in title(attempts[0])


def test_eight_retries__nine_bars_eight_waits_and_the_sweep_between_them() -> None:
    svg = draw(eight_retries_run())

    charge = [a for a in elements(svg, "af-tl-attempt") if a.get("data-seq") == "2"]
    waits = elements(svg, "af-tl-wait")
    assert [a.get("data-outcome") for a in charge] == ["retried"] * 8 + ["completed"]
    assert [a.get("data-attempt") for a in charge] == [str(n) for n in range(1, 10)]
    assert len(waits) == 8
    # Each wait starts where its failed attempt ends, and the next attempt starts after it.
    for failed, wait, following in zip(charge, waits, charge[1:], strict=False):
        line = wait.find("{http://www.w3.org/2000/svg}line")
        assert line is not None
        assert float(line.get("x1")) == pytest.approx(box(failed)[1] - 0, abs=3.1)
        assert float(line.get("x2")) <= box(following)[0] + 0.1
    assert "partner said 503" in title(charge[0])
    assert "back-off, 500 ms: from 12:00:00.150, next attempt due at 12:00:00.650" in title(
        waits[0]
    )
    [sweep] = elements(svg, "af-tl-mark")
    assert sweep.get("data-kind") == "sweep" and sweep.get("data-seq") == "2"
    assert "Re-enqueued by the sweeper" in title(sweep)
    assert texts(svg, "af-tl-summary") == [
        "✓ completed · 10 ms",
        "✓ 9 attempts · completed",
        "✓ completed · 10 ms",
    ]


def test_takeover__lost_claim_then_crash_gap_then_the_next_attempt() -> None:
    rows = new_run("wf_crash", "RUNNING")
    rows.step(1, "prepare", start=0.01, end=0.02)
    rows.step(
        2,
        "hold",
        start=10.1,
        end=None,
        attempts=2,
        fence=2,
        first_started_at=at(0.05),
        lease_owner="celery@w2:99:def",
    )
    rows.takeover(2, claimed=0.05, taken=10.1, reason="lease_expired", recorded=10.3)

    svg = draw(rows, now=14)

    first, second = (a for a in elements(svg, "af-tl-attempt") if a.get("data-seq") == "2")
    [gap] = elements(svg, "af-tl-gap")
    assert (first.get("data-outcome"), second.get("data-outcome")) == ("lost", "running")
    gap_start, gap_end = box(gap)
    assert gap_start == pytest.approx(box(first)[0], abs=0.2)
    assert gap_end == pytest.approx(box(second)[0], abs=0.2)  # the gap ends at the takeover
    assert "crash gap, 10.1 s" in title(gap) and "(lease expired)" in title(gap)
    assert "celery@w1:4242:abc" in title(first)
    assert elements(svg, "af-tl-now")  # still running: the right edge is now


def test_checkpoint_without_events__earlier_attempts_show_as_unrecorded() -> None:
    """Rows written before the engine recorded attempts: the checkpoint still says when the
    first attempt began, so the time is shown, without inventing bars."""
    rows = new_run("wf_old")
    rows.step(1, "charge", start=5.0, end=5.2, attempts=3, first_started_at=at(1.0))

    svg = draw(rows)

    assert len(elements(svg, "af-tl-attempt")) == 1
    [unrecorded] = elements(svg, "af-tl-unrecorded")
    assert "earlier attempts, no details recorded" in title(unrecorded)
    assert not elements(svg, "af-tl-gap")


def test_operator_and_park_marks__run_lane_for_run_events_step_lane_for_step_events() -> None:
    rows = new_run("wf_marks", "NEEDS_ATTENTION")
    rows.step(1, "charge", start=0.1, end=None)
    rows.run.updated_at = at(4)
    rows.event(
        RunEvent.Kind.OUTCOME_UNKNOWN,
        when=4,
        seq=1,
        detail="partner unreachable",
        data={"attempt": 1, "fence": 1, "error": "timeout"},
    )
    rows.event(RunEvent.Kind.OPERATOR_RESUME, when=2, actor="ops-ana", detail="customer called")

    drawn = timeline.build(rows.run, rows.steps, rows.events, now=at(9))
    svg = str(timeline_svg.render(drawn))

    assert drawn.lanes[0].attempts[0].outcome == Outcome.INTERRUPTED
    assert not drawn.open_ended
    marks = {m.get("data-kind"): m for m in elements(svg, "af-tl-mark")}
    assert set(marks) == {"parked", "operator"}
    assert marks["parked"].get("data-seq") == "1"
    assert marks["operator"].get("data-seq") is None  # on the run lane
    assert "Resumed now by an operator (ops-ana): customer called" in title(marks["operator"])
    assert drawn.mark_kinds == {MarkKind.PARKED, MarkKind.OPERATOR}


@pytest.mark.parametrize(
    "data",
    [
        None,
        "not a dict",
        {},
        {"started_at": "yesterday", "ended_at": 5},
        {"started_at": iso(1), "attempt": "two", "fence": True, "retry_at": "soon"},
        {"previous": "gone"},
        {"previous": {"started_at": None}},
    ],
)
def test_odd_event_data__dropped_detail_never_an_error(data: object) -> None:
    rows = new_run("wf_odd")
    rows.step(1, "charge", start=2.0, end=2.5)
    for kind in (RunEvent.Kind.ATTEMPT_FAILED, RunEvent.Kind.TAKEOVER):
        rows.event(kind, when=1.5, seq=1, data=data)
    rows.event(RunEvent.Kind.SWEEP_REQUEUE, when=1.0, seq=99, detail="for a step not recorded")

    svg = draw(rows)

    assert elements(svg, "af-tl-attempt")
    assert [m.get("data-kind") for m in elements(svg, "af-tl-mark")] == ["sweep"]


def test_html_in_names_errors_and_reasons__escaped_and_still_valid_xml() -> None:
    rows = new_run("wf_<b>html</b>", "FAILED")
    rows.step(
        1,
        "<script>alert(1)</script>" * 3,
        start=0.1,
        end=0.2,
        status="FAILED",
        error="<html><body>502 Bad Gateway & more</body></html>",
    )
    rows.event(RunEvent.Kind.OPERATOR_CANCEL, when=0.3, actor="<i>", detail='"quoted" & <b>')

    svg = draw(rows)

    assert "<script>" not in svg and "<html>" not in svg
    [attempt] = elements(svg, "af-tl-attempt")
    assert "502 Bad Gateway & more" in title(attempt)  # escaped in markup, intact as text
    assert attempt.get("data-outcome") == "failed"
    [lane_label] = texts(svg, "af-tl-name")
    assert lane_label.endswith("…") and len(lane_label) <= timeline_svg.NAME_CHARS + 3


def test_instant_run__a_zero_length_run_still_draws() -> None:
    rows = new_run("wf_instant")
    rows.step(1, "only", start=0, end=0)

    svg = draw(rows, now=0)

    [attempt] = elements(svg, "af-tl-attempt")
    assert box(attempt)[1] - box(attempt)[0] == timeline_svg.MIN_BAR_W
    assert len(elements(svg, "af-tl-tick")) >= 1


@pytest.mark.parametrize(
    ("seconds", "ticks"), [(0.3, "0 +50 ms +100 ms"), (130, "0 +30 s +60 s"), (4000, "0 +10 min")]
)
def test_axis__round_ticks_whatever_the_length(seconds: float, ticks: str) -> None:
    rows = new_run("wf_axis")
    rows.step(1, "only", start=0, end=seconds)
    rows.run.updated_at = at(seconds)

    svg = draw(rows)

    labels = " ".join(t.findtext(f"{SVG}text") or "" for t in elements(svg, "af-tl-tick"))
    assert labels.startswith(ticks)
    assert len(elements(svg, "af-tl-tick")) <= timeline_svg.TICKS_AT_MOST + 1


def test_resumed_early__the_wait_ends_where_the_next_attempt_began() -> None:
    rows = new_run("wf_resumed")
    rows.failed_attempt(1, 1, start=1.0, end=1.1, retry_in=3600)
    rows.step(1, "charge", start=5.0, end=5.2, attempts=2, first_started_at=at(1.0))
    rows.event(RunEvent.Kind.OPERATOR_RESUME, when=4.9, seq=1, actor="ops", detail="now")

    drawn = timeline.build(rows.run, rows.steps, rows.events, now=at(6))

    [wait] = drawn.lanes[0].waits
    assert (wait.start, wait.end, wait.note) == (at(1.1), at(5.0), "back-off, cut short")
    assert drawn.end < at(60)  # the axis is not stretched to the planned retry an hour out


def test_failed_checkpoint_told_by_its_event_too__drawn_once() -> None:
    """The engine writes an event for every failed attempt, the last one included, and moves
    the checkpoint's fence on: the two are matched by their database times, not fences."""
    rows = new_run("wf_failedonce", "FAILED")
    rows.failed_attempt(1, 1, start=1.0, end=1.2, retry_in=0.5)
    rows.failed_attempt(1, 2, start=1.8, end=2.0, retry_in=None)
    rows.step(
        1,
        "charge",
        start=1.8,
        end=2.0,
        status="FAILED",
        attempts=2,
        fence=3,
        first_started_at=at(1.0),
        error="card declined",
    )

    drawn = timeline.build(rows.run, rows.steps, rows.events, now=at(3))

    assert [a.outcome for a in drawn.lanes[0].attempts] == [Outcome.RETRIED, Outcome.FAILED]
    assert drawn.lanes[0].summary == "✕ 2 attempts · failed"


def test_failed_read_step__its_event_has_no_start_and_is_drawn_at_its_end() -> None:
    rows = new_run("wf_readfail")
    rows.event(
        RunEvent.Kind.ATTEMPT_FAILED,
        when=1.0,
        seq=1,
        data={
            "attempt": 1,
            "fence": None,
            "started_at": None,
            "ended_at": iso(1.0),
            "error": "timeout",
            "retry_at": iso(1.5),
            "owner": "",
        },
    )
    rows.step(1, "lookup", start=1.6, end=1.6, kind="read", attempts=2, fence=2)

    drawn = timeline.build(rows.run, rows.steps, rows.events, now=at(2))

    first, second = drawn.lanes[0].attempts
    assert (first.start, first.end, first.outcome) == (at(1.0), at(1.0), Outcome.RETRIED)
    assert second.outcome == Outcome.COMPLETED


def test_waiting_run__its_checkpoint_retry_time_is_the_wait() -> None:
    rows = new_run("wf_waiting", "WAITING")
    rows.step(1, "charge", start=1.0, end=1.2, status="FAILED", retryable=True, retry_at=at(9))

    drawn = timeline.build(rows.run, rows.steps, rows.events, now=at(5))

    [wait] = drawn.lanes[0].waits
    assert (wait.start, wait.end) == (at(1.2), at(9))
    assert drawn.lanes[0].summary == "↻ retry due"
    assert drawn.open_ended and drawn.end == at(9)


# --- waits: timers, signals, approvals ------------------------------------------------------------
def approved_run() -> Rows:
    """prepare; charge waited 30 s for approval, approved by alice, then ran; finish."""
    rows = new_run("wf_approved")
    rows.step(1, "prepare", start=0.0, end=0.1, kind="read")
    rows.wait(
        2,
        "approval",
        "charge",
        start=0.2,
        end=30.2,
        deadline=0.2 + 48 * 3600,
        outcome={"approved": True, "actor": "alice", "reason": "ok", "timed_out": False},
        actor="alice",
        reason="ok",
    )
    rows.step(2, "charge", start=30.3, end=30.8, kind="effect")
    rows.step(3, "finish", start=30.9, end=31.0, kind="read")
    rows.run.updated_at = at(31)
    return rows


def test_approval_wait__a_bar_from_the_request_to_the_decision__labelled_with_both() -> None:
    rows = approved_run()
    svg = draw(rows)

    [bar] = elements(svg, "af-tl-wait-bar")
    assert (bar.get("data-seq"), bar.get("data-kind"), bar.get("data-ended")) == (
        "2",
        "approval",
        "approved",
    )
    [charge] = [a for a in elements(svg, "af-tl-attempt") if a.get("data-seq") == "2"]
    assert box(bar)[1] <= box(charge)[0] + 0.1  # the wait ends where the call begins
    assert box(bar)[1] - box(bar)[0] > 500  # 30 s of a 31 s run
    assert texts(svg, "af-tl-wait-label") == ["approval of charge: approved by alice"]
    assert "12:00:00.200 → 12:00:30.200 (30.0 s)" in title(bar)
    legend = "".join(svg_root(svg).find(f".//{SVG}g[@class='af-tl-legend']").itertext())
    assert "waited for approval" in legend
    assert "1 wait" in timeline_svg.describe(
        timeline.build(rows.run, rows.steps, rows.events, now=at(31), waits=rows.waits)
    )


def test_waiting_for_a_signal__its_own_lane_before_any_checkpoint__open_to_now() -> None:
    rows = new_run("wf_waits", "WAITING")
    rows.run.current_seq, rows.run.current_step = 2, "reply"
    rows.step(1, "prepare", start=0.0, end=0.1, kind="read")
    rows.wait(2, "signal", "reply", start=0.2, end=None)

    drawn = timeline.build(rows.run, rows.steps, rows.events, now=at(61), waits=rows.waits)
    svg = str(timeline_svg.render(drawn))

    lane = drawn.lanes[1]
    assert (lane.seq, lane.name, lane.kind, lane.attempts) == (2, "reply", "wait", [])
    assert lane.summary == "⏸ waiting"
    assert drawn.end == at(61)
    [bar] = elements(svg, "af-tl-wait-bar")
    assert bar.get("data-ended") == "open"
    assert bar.find(f"{SVG}rect").get("stroke-dasharray")  # open: dashed
    assert title(bar) == "#2 waits for signal 'reply'\nsince 12:00:00.200 (60.8 s so far)"
    assert texts(svg, "af-tl-wait-label") == ["signal 'reply': waiting"]


@pytest.mark.parametrize(
    ("kind", "name", "start", "end", "outcome", "fields", "label", "ended"),
    [
        ("timer", "sleep", 1.0, 61.0, {"woke_at": "x"}, {}, "a timer: its time came", "woke"),
        (
            "signal",
            "reply",
            1.0,
            61.0,
            {"timed_out": True},
            {},
            "signal 'reply': timed out",
            "timed_out",
        ),
        (
            "signal",
            "reply",
            1.0,
            20.0,
            {"payload": 1},
            {"actor": "signal", "reason": "sms-7"},
            "signal 'reply': received (sms-7)",
            "received",
        ),
        (
            "signal",
            "reply",
            1.0,
            1.0,
            {"payload": 1},
            {"actor": "signal", "reason": "sms-7"},
            "signal 'reply': taken at once, sent earlier (sms-7)",
            "taken",
        ),
        (
            "approval",
            "charge",
            1.0,
            61.0,
            {"approved": False, "timed_out": True},
            {},
            "approval of charge: rejected: no decision in time",
            "timed_out",
        ),
        (
            "approval",
            "charge",
            1.0,
            20.0,
            {"approved": False},
            {"actor": "bob"},
            "approval of charge: rejected by bob",
            "rejected",
        ),
        (
            "signal",
            "reply",
            1.0,
            None,
            None,
            {},
            "signal 'reply': unanswered (the run is cancelled)",
            "unanswered",
        ),
    ],
)
def test_each_kind_of_wait__says_what_it_waited_for_and_how_it_ended(
    kind: str,
    name: str,
    start: float,
    end: float | None,
    outcome: object,
    fields: dict[str, str],
    label: str,
    ended: str,
) -> None:
    rows = new_run("wf_ends", "CANCELLED")
    rows.step(1, "prepare", start=0.0, end=0.5, kind="read")
    rows.wait(2, kind, name, start=start, end=end, outcome=outcome, **fields)
    rows.run.updated_at = at(70)

    svg = draw(rows)

    [bar] = elements(svg, "af-tl-wait-bar")
    assert bar.get("data-ended") == ended
    assert label in title(bar)
    shown = texts(svg, "af-tl-wait-label")[0]
    assert shown == label or (shown.endswith("…") and label.startswith(shown[:-1]))


def test_wait_label__inside_a_wide_bar__under_a_narrow_one() -> None:
    rows = approved_run()
    rows.wait(3, "signal", "late", start=30.85, end=30.85, outcome={"payload": None}, reason="s-1")
    svg = draw(rows)

    wide, narrow = elements(svg, "af-tl-wait-bar")
    for bar, inside in ((wide, True), (narrow, False)):
        rect, text = bar.find(f"{SVG}rect"), bar.find(f"{SVG}text")
        top, bottom = float(rect.get("y")), float(rect.get("y")) + float(rect.get("height"))
        assert (top < float(text.get("y")) <= bottom) is inside


def test_wait_names_with_html__escaped_and_still_valid_xml() -> None:
    rows = new_run("wf_html_wait", "WAITING")
    rows.run.current_seq, rows.run.current_step = 1, "<b>step</b>"
    rows.wait(1, "signal", "<script>x</script>", start=0.0, end=None)

    svg = draw(rows, now=5)

    assert "<script>" not in svg
    assert texts(svg, "af-tl-wait-label") == ["signal '<script>x</script>': waiting"]
