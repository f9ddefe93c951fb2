"""The admin console's newer parts on real Postgres and Redis: the dashboard, Resume now, the
timeline on the run page, odd data, domain links, and query counts that ignore list size."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentflow import _store as store
from agentflow._base.states import RunStatus, StepStatus
from agentflow._core import links
from agentflow.admin import dashboard as dashboard_module
from agentflow.admin import timeline
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from tests.support.admin import LIST_URL, detail_url, make_run, published_steps, text
from tests.support.timelines import (
    box,
    eight_retries_run,
    elements,
    new_run,
    ten_step_run,
)

pytestmark = pytest.mark.django_db


def svg_of(page: str) -> str:
    found = re.search(r"<svg class=\"af-timeline-svg\".*?</svg>", page, re.DOTALL)
    assert found, "no timeline on the page"
    return found.group(0)


FINISHED = (RunStatus.COMPLETED, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


def many_runs(count: int) -> None:
    """`count` finished runs with a checkpoint and an event each, inserted in bulk."""
    now = timezone.now()
    runs = [
        WorkflowRun(
            workflow="demo",
            version=1,
            status=FINISHED[n % len(FINISHED)],
            current_step="greet",
            current_seq=1,
        )
        for n in range(count)
    ]
    WorkflowRun.objects.bulk_create(runs)
    WorkflowRun.objects.filter(pk__in=[r.pk for r in runs]).update(
        created_at=now - timedelta(days=3)
    )
    StepCheckpoint.objects.bulk_create(
        StepCheckpoint(
            run=run,
            seq=1,
            name="greet",
            kind="read",
            status=StepStatus.COMPLETED,
            idempotency_key=f"{run.pk}_step_1",
            first_started_at=now,
            started_at=now,
            finished_at=now,
            output={"greeting": "hi"},
        )
        for run in runs
    )
    RunEvent.objects.bulk_create(
        RunEvent(run=run, kind=RunEvent.Kind.SWEEP_REQUEUE, actor="sweeper", detail="x", seq=1)
        for run in runs
    )


# --- the run list -------------------------------------------------------------------------------
def test_run_list__same_number_of_queries_for_10_and_for_1000_runs(admin_client: Client) -> None:
    many_runs(10)
    admin_client.get(LIST_URL)  # warms per-process caches (content types, sessions)
    with CaptureQueriesContext(connection) as ten:
        assert admin_client.get(LIST_URL).status_code == 200
    many_runs(990)
    with CaptureQueriesContext(connection) as thousand:
        response = admin_client.get(LIST_URL)

    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == 100
    print(f"run list: {len(thousand.captured_queries)} queries for 10 and for 1,000 runs")
    assert len(thousand.captured_queries) == len(ten.captured_queries)


def test_dashboard__counts_stuck_parked_last_hour_and_the_sweepers_age(
    admin_client: Client,
) -> None:
    for status in RunStatus.values:
        make_run(status)
    stuck = make_run(RunStatus.WAITING, wake_in=-120)
    make_run(RunStatus.NEEDS_ATTENTION)
    now = timezone.now()
    for kind, ago in [
        (RunEvent.Kind.ATTEMPT_FAILED, 60),
        (RunEvent.Kind.ATTEMPT_FAILED, 600),
        (RunEvent.Kind.ATTEMPT_FAILED, 7200),  # older than the hour: not counted
        (RunEvent.Kind.SWEEP_REQUEUE, 30),
        (RunEvent.Kind.TAKEOVER, 5),
        (RunEvent.Kind.OPERATOR_RETRY, 5),  # not a figure of its own
    ]:
        event = RunEvent.objects.create(run=stuck, kind=kind, seq=1)
        RunEvent.objects.filter(pk=event.pk).update(at=now - timedelta(seconds=ago))
    store.heartbeat_record(requeued=3, query_ms=0.7)

    response = admin_client.get(LIST_URL)

    board = response.context["af_dashboard"]
    counts = {s["value"]: s["count"] for s in board["statuses"]}
    assert counts == {
        "PENDING": "1",
        "RUNNING": "1",
        "WAITING": "2",
        "COMPLETED": "1",
        "FAILED": "1",
        "CANCELLED": "1",
        "NEEDS_ATTENTION": "2",
    }
    assert not board["estimated"]
    assert (board["overdue"], board["needs_attention"]) == (1, 2)
    recent = board["recent"]
    assert (recent["retries"]["n"], recent["sweeps"]["n"], recent["takeovers"]["n"]) == (2, 1, 1)
    sweeper = board["sweeper"]
    assert sweeper["ran"] and not sweeper["late"] and sweeper["requeued"] == 3
    page = text(response)
    assert "Stuck now" in page and "Sweeper" in page and "Last hour" in page
    assert "How these figures are counted" in page


def test_dashboard__a_silent_sweeper_is_flagged(admin_client: Client, settings: Any) -> None:
    never = admin_client.get(LIST_URL).context["af_dashboard"]["sweeper"]
    store.heartbeat_record(requeued=0, query_ms=0.1)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE agentflow_sweeperheartbeat SET swept_at = now() - interval '1 hour'")

    response = admin_client.get(LIST_URL)

    assert (never["ran"], never["late"]) == (False, True)
    late = response.context["af_dashboard"]["sweeper"]
    assert late["ran"] and late["late"] and late["age"] == "60 min 0 s"
    assert f"silent for over {3 * settings.AGENTFLOW_SWEEP_INTERVAL} s: is beat running?" in text(
        response
    )


def test_dashboard__last_hour_beyond_the_window_is_a_floor(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dashboard_module, "RECENT_EVENTS", 3)
    run = make_run(RunStatus.RUNNING)
    for _ in range(5):
        RunEvent.objects.create(run=run, kind=RunEvent.Kind.ATTEMPT_FAILED, seq=1)

    recent = admin_client.get(LIST_URL).context["af_dashboard"]["recent"]

    assert recent["at_least"] and recent["retries"]["label"] == "≥ 3"


def test_dashboard__terminal_counts_become_estimates_past_the_limit(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("estimates come from Postgres's planner")
    from agentflow.admin import counting

    monkeypatch.setattr(counting, "EXACT_COUNT_LIMIT", 2)
    many_runs(30)
    make_run(RunStatus.NEEDS_ATTENTION)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE agentflow_workflowrun")

    board = admin_client.get(LIST_URL).context["af_dashboard"]

    by_status = {s["value"]: s for s in board["statuses"]}
    assert board["estimated"]
    assert by_status["COMPLETED"]["approx"] and by_status["COMPLETED"]["count"].startswith("≈")
    assert not by_status["NEEDS_ATTENTION"]["approx"]  # parked runs are always exact (I7)
    assert by_status["NEEDS_ATTENTION"]["count"] == "1"


# --- Resume now ---------------------------------------------------------------------------------
def test_resume_now__waiting_run_is_published_at_once_with_an_event(
    admin_client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    run = make_run(RunStatus.WAITING, wake_in=3600)
    StepCheckpoint.objects.filter(run=run, seq=2).update(
        retry_at=timezone.now() + timedelta(hours=1)
    )

    with django_capture_on_commit_callbacks(execute=True) as published:
        response = admin_client.post(
            detail_url(run, "resume"), {"reason": "partner is back (INC-7)"}, follow=True
        )

    assert f"Run {run.pk} resumed. Step #2 pretend_effect was published again." in text(response)
    run.refresh_from_db()
    event = run.events.get()
    assert (event.kind, event.actor, event.detail, event.seq) == (
        "operator_resume",
        "admin",
        "partner is back (INC-7)",
        2,
    )
    assert event.data["status"] == "WAITING"
    # The runtime will not drop the message as early: the retry time is now.
    checkpoint = run.steps.get(seq=2)
    assert checkpoint.retry_at <= timezone.now()
    assert run.wake_at - store.enqueue_grace() <= timezone.now()
    # One step message (the metrics count the event with a callback of their own).
    assert len([c for c in published if c.__qualname__.startswith("send_step")]) == 1
    if connection.vendor == "postgresql":
        assert published_steps(run.pk) == [[run.pk, 2]]


def test_resume_now__publishes_only_when_the_transaction_commits(
    django_capture_on_commit_callbacks: Any,
) -> None:
    run = make_run(RunStatus.RUNNING)

    with django_capture_on_commit_callbacks(execute=False) as pending:
        store.run_resume(run.pk, actor="ops", reason="lost message")
        assert published_steps(run.pk) == []  # nothing before the commit

    [publish] = [c for c in pending if c.__qualname__.startswith("send_step")]
    publish()
    assert published_steps(run.pk) == [[run.pk, 2]]


def test_resume_now__rolled_back_resume_publishes_nothing() -> None:
    run = make_run(RunStatus.RUNNING)

    with pytest.raises(RuntimeError), transaction.atomic():
        store.run_resume(run.pk, actor="ops", reason="will roll back")
        raise RuntimeError("the caller's transaction fails")

    assert not RunEvent.objects.filter(run=run).exists()
    assert published_steps(run.pk) == []


@pytest.mark.parametrize(
    "status", [RunStatus.FAILED, RunStatus.COMPLETED, RunStatus.NEEDS_ATTENTION]
)
def test_resume_now__refused_for_runs_that_are_not_active(
    admin_client: Client, status: str
) -> None:
    run = make_run(status)

    response = admin_client.post(detail_url(run, "resume"), {"reason": "try"}, follow=True)

    assert f"Run {run.pk} was not resumed: only active runs can be resumed now" in text(response)
    assert not run.events.exists()


def test_resume_now__from_the_list_for_several_runs(admin_client: Client) -> None:
    waiting = make_run(RunStatus.WAITING, wake_in=600)
    running = make_run(RunStatus.RUNNING)
    done = make_run(RunStatus.COMPLETED)
    chosen = {"action": "resume_runs", "_selected_action": [waiting.pk, running.pk, done.pk]}

    response = admin_client.post(
        LIST_URL, {**chosen, "post": "yes", "reason": "after the outage"}, follow=True
    )

    page = text(response)
    assert "2 runs resumed." in page
    assert f"Run {done.pk} was not resumed" in page
    assert set(RunEvent.objects.values_list("run_id", "kind")) == {
        (waiting.pk, "operator_resume"),
        (running.pk, "operator_resume"),
    }


def test_resume_now__viewer_cannot(viewer: Client) -> None:
    run = make_run(RunStatus.WAITING)

    page = text(viewer.get(detail_url(run)))
    forged = viewer.post(detail_url(run, "resume"), {"reason": "r"})

    assert 'class="af-tool-resume"' not in page
    assert forged.status_code == 403
    assert not run.events.exists()


# --- the timeline on the run page ---------------------------------------------------------------
def test_run_page__draws_the_timeline_of_a_ten_step_run(admin_client: Client) -> None:
    run = ten_step_run("wf_pageten").save()

    page = text(admin_client.get(detail_url(run)))

    svg = svg_of(page)
    assert len(elements(svg, "af-tl-lane")) == 10
    assert [a.get("data-outcome") for a in elements(svg, "af-tl-attempt")] == ["completed"] * 10


def test_run_page__draws_eight_retries_with_their_waits(admin_client: Client) -> None:
    run = eight_retries_run("wf_pageretries").save()

    page = text(admin_client.get(detail_url(run)))

    svg = svg_of(page)
    charge = [a for a in elements(svg, "af-tl-attempt") if a.get("data-seq") == "2"]
    assert len(charge) == 9 and len(elements(svg, "af-tl-wait")) == 8
    assert [m.get("data-kind") for m in elements(svg, "af-tl-mark")] == ["sweep"]


def test_run_page__takeover_gap_sits_between_the_two_attempts(admin_client: Client) -> None:
    rows = new_run("wf_pagecrash")
    rows.step(1, "prepare", start=0.01, end=0.02)
    rows.step(
        2,
        "hold",
        start=10.1,
        end=10.4,
        attempts=2,
        fence=2,
        first_started_at=rows.steps[0].started_at,
    )
    rows.takeover(2, claimed=0.05, taken=10.1, reason="owner_gone")
    run = rows.save()

    svg = svg_of(text(admin_client.get(detail_url(run))))

    first, second = (a for a in elements(svg, "af-tl-attempt") if a.get("data-seq") == "2")
    [gap] = elements(svg, "af-tl-gap")
    assert box(first)[0] <= box(gap)[0] < box(gap)[1] <= box(second)[0] + 0.2


def test_run_page__timeline_that_cannot_be_drawn_leaves_the_page_whole(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = make_run(RunStatus.COMPLETED)

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ValueError("a bug in the drawing")

    monkeypatch.setattr(timeline, "build", broken)
    response = admin_client.get(detail_url(run))

    assert response.status_code == 200
    assert "The timeline could not be drawn" in text(response)
    assert run.steps.first().idempotency_key in text(response)


# --- odd data -----------------------------------------------------------------------------------
def test_odd_data__null_huge_and_html_outputs_never_break_the_page(admin_client: Client) -> None:
    run = make_run(RunStatus.COMPLETED, steps=3)
    huge = {"blob": "x" * 5_000_000, "note": "<b>end</b>"}
    StepCheckpoint.objects.filter(run=run, seq=1).update(output=None)
    StepCheckpoint.objects.filter(run=run, seq=2).update(output=huge)
    StepCheckpoint.objects.filter(run=run, seq=3).update(
        output={"html": "<script>alert('step')</script>"}
    )
    WorkflowRun.objects.filter(pk=run.pk).update(
        output={"html": "<img src=x onerror=alert(1)>"}, input=["<i>list input</i>"]
    )
    RunEvent.objects.create(
        run=run,
        kind=RunEvent.Kind.LATE_COMPLETION,
        seq=2,
        detail="<b>late</b>",
        data={"attempt": 1, "fence": 1, "output": huge},
    )

    response = admin_client.get(detail_url(run))

    assert response.status_code == 200
    page = text(response)
    assert "<script>alert" not in page and "<img src=x" not in page and "<b>late</b>" not in page
    assert "&lt;script&gt;alert(&#x27;step&#x27;)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "Preview of the first 20,000 characters; 5.0 MB in all" in page
    assert len(response.content) < 400_000  # two 5 MB payloads, shown as previews
    svg_of(page)


def test_odd_data__a_definition_gone_from_the_code(admin_client: Client) -> None:
    run = make_run(RunStatus.NEEDS_ATTENTION)
    WorkflowRun.objects.filter(pk=run.pk).update(workflow="retired_flow", version=7)
    StepCheckpoint.objects.filter(run=run).update(name="a_step_since_renamed")

    listing = admin_client.get(LIST_URL)
    detail = admin_client.get(detail_url(run))
    retry = admin_client.post(detail_url(run, "retry"), {"reason": "try anyway"}, follow=True)

    assert listing.status_code == detail.status_code == retry.status_code == 200
    assert "retired_flow v7" in text(detail) and "not in this code" in text(detail)
    assert "a_step_since_renamed" in svg_of(text(detail))
    assert f"Run {run.pk} retried." in text(retry)


def test_odd_data__events_with_garbage_data_and_runs_without_steps(admin_client: Client) -> None:
    bare = make_run(RunStatus.PENDING)
    odd = make_run(RunStatus.RUNNING)
    for data in (None, "text", [1, 2], {"started_at": "not a time"}, {"previous": 3}):
        for kind in (RunEvent.Kind.ATTEMPT_FAILED, RunEvent.Kind.TAKEOVER):
            RunEvent.objects.create(run=odd, kind=kind, seq=2, data=data)

    for run in (bare, odd):
        response = admin_client.get(detail_url(run))
        assert response.status_code == 200
        svg_of(text(response))


# --- links to the domain ------------------------------------------------------------------------
def test_links__a_linker_that_raises_shows_nothing_and_keeps_the_page(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> list[links.Link]:
        raise KeyError("refund_id")

    monkeypatch.setitem(links._run_linkers, "demo", broken)
    monkeypatch.setitem(links._step_linkers, "demo", broken)
    run = make_run(RunStatus.COMPLETED)

    response = admin_client.get(detail_url(run))

    assert response.status_code == 200
    assert "Partner:" not in text(response)


def test_links__step_and_run_links_are_shown_escaped(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    def run_links(run: links.RunRef) -> list[links.Link]:
        return [links.Link(label=f"Order <{run.business_key}>", url="/orders/1/", title="o")]

    def step_links(run: links.RunRef, step: links.StepRef) -> list[links.Link]:
        output = step.output or {}
        if "step" not in output:
            return []
        return [links.Link(label=f"obj_{step.seq}", url=f"https://partner.test/{step.seq}")]

    monkeypatch.setitem(links._run_linkers, "demo", run_links)
    monkeypatch.setitem(links._step_linkers, "demo", step_links)
    run = make_run(RunStatus.COMPLETED, steps=3, business_key="k<1>")

    with CaptureQueriesContext(connection) as queries:
        page = text(admin_client.get(detail_url(run)))

    assert '<a href="/orders/1/" title="o">Order &lt;k&lt;1&gt;&gt;</a>' in page
    for seq in (1, 2, 3):
        assert f'href="https://partner.test/{seq}"' in page
    assert len(queries.captured_queries) < 20
