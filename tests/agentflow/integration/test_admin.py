"""The operator's admin against real Postgres and Redis: pages, query counts, Retry and Cancel.

Runs are made with the ORM in the shape the engine leaves them in; the actions themselves go
through the real `store` functions and publish real step messages to the test's broker.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentflow._base.states import RunStatus
from agentflow.admin import actions, counting, dates
from agentflow.models import RunEvent, WorkflowRun
from tests.support.admin import LIST_URL, detail_url, make_run, published_steps, text

pytestmark = pytest.mark.django_db


# --- list and detail pages ----------------------------------------------------------------------
def test_run_list__shows_every_status_and_the_dashboard(admin_client: Client) -> None:
    runs = {status: make_run(status) for status in RunStatus.values}
    make_run(RunStatus.RUNNING, wake_in=-90)  # overdue: the sweeper's backlog
    make_run(RunStatus.NEEDS_ATTENTION)

    response = admin_client.get(LIST_URL)

    assert response.status_code == 200
    page = text(response)
    for status, run in runs.items():
        assert run.pk in page
        assert f"af-badge af-{status.lower()}" in page
    dashboard = response.context["af_dashboard"]
    assert dashboard["needs_attention"] == 2
    assert dashboard["overdue"] == 1
    assert dashboard["overdue_oldest"].endswith(" s")
    assert "overdue by" in page
    assert "?status__exact=NEEDS_ATTENTION" in page
    assert "?wake=overdue" in page


def test_run_list__filters_by_status_workflow_wake_up_and_searches_ids_and_keys(
    admin_client: Client,
) -> None:
    parked = make_run(RunStatus.NEEDS_ATTENTION, business_key="rf_parked")
    late = make_run(RunStatus.WAITING, wake_in=-5)
    done = make_run(RunStatus.COMPLETED)

    def listed(query: str) -> set[str]:
        response = admin_client.get(LIST_URL + query)
        assert response.status_code == 200
        return {run.pk for run in response.context["cl"].result_list}

    assert listed("?status__exact=NEEDS_ATTENTION") == {parked.pk}
    assert listed("?wake=overdue") == {late.pk}
    assert listed("?workflow=demo") == {parked.pk, late.pk, done.pk}
    assert listed("?workflow=bench") == set()
    assert listed("?q=rf_parked") == {parked.pk}
    assert listed(f"?q={done.pk}") == {done.pk}
    assert listed(f"?q={late.pk[:12]}") == {late.pk}


def test_run_detail__shows_fields_steps_and_events_for_every_status(admin_client: Client) -> None:
    for status in RunStatus.values:
        run = make_run(
            status,
            events=(
                (RunEvent.Kind.SWEEP_REQUEUE, "sweeper", "lease expired; re-enqueued"),
                (RunEvent.Kind.OPERATOR_RETRY, "ops-ana", "partner confirmed <no charge>"),
            ),
        )

        response = admin_client.get(detail_url(run))

        assert response.status_code == 200, status
        page = text(response)
        assert "ops-ana" in page
        assert "partner confirmed &lt;no charge&gt;" in page  # escaped, never raw HTML
        assert "&quot;nested&quot;: {" in page  # input pretty-printed
        for cp in run.steps.all():
            assert cp.idempotency_key in page
            assert f"#{cp.seq} {cp.name}" in page
        assert 'name="_save"' not in page  # a detail view, not an edit form


def test_run_detail__offers_only_the_actions_that_fit_the_status(admin_client: Client) -> None:
    offered = {}
    for status in RunStatus.values:
        page = text(admin_client.get(detail_url(make_run(status))))
        offered[status] = {
            verb for verb in ("retry", "resume", "cancel") if f'class="af-tool-{verb}"' in page
        }

    assert offered == {
        "PENDING": {"resume", "cancel"},
        "RUNNING": {"resume", "cancel"},
        "WAITING": {"resume", "cancel"},
        "COMPLETED": set(),
        "FAILED": {"retry"},
        "CANCELLED": set(),
        "NEEDS_ATTENTION": {"retry", "cancel"},
    }


def test_run_list__query_count_does_not_grow_with_the_page(admin_client: Client) -> None:
    for _ in range(10):
        make_run(RunStatus.COMPLETED, steps=3)
    with CaptureQueriesContext(connection) as ten:
        assert admin_client.get(LIST_URL).status_code == 200
    for n in range(90):
        make_run(RunStatus.values[n % 7], steps=3, created_ago=timedelta(days=n % 40))
    with CaptureQueriesContext(connection) as hundred:
        response = admin_client.get(LIST_URL)

    assert len(response.context["cl"].result_list) == 100
    print(f"run list: {len(hundred.captured_queries)} queries for a page of 100 runs")
    assert len(hundred.captured_queries) == len(ten.captured_queries)
    assert len(hundred.captured_queries) <= 14, [q["sql"][:120] for q in hundred.captured_queries]


def test_run_detail__query_count_does_not_grow_with_steps_or_events(admin_client: Client) -> None:
    small = make_run(RunStatus.RUNNING, steps=1)
    big = make_run(RunStatus.NEEDS_ATTENTION, steps=3)
    for n in range(30):
        RunEvent.objects.create(run=big, kind=RunEvent.Kind.SWEEP_REQUEUE, detail=f"sweep {n}")

    admin_client.get(detail_url(small))  # warms per-process caches (content types)
    with CaptureQueriesContext(connection) as few:
        admin_client.get(detail_url(small))
    with CaptureQueriesContext(connection) as many:
        admin_client.get(detail_url(big))

    print(f"run detail: {len(many.captured_queries)} queries with 3 steps and 30 events")
    assert len(many.captured_queries) == len(few.captured_queries) <= 12


def test_run_list__counts_past_the_limit_are_estimates(admin_client: Client, monkeypatch) -> None:
    monkeypatch.setattr(counting, "EXACT_COUNT_LIMIT", 3)
    for _ in range(5):
        make_run(RunStatus.COMPLETED)

    response = admin_client.get(LIST_URL)

    assert response.status_code == 200
    paginator = response.context["cl"].paginator
    if connection.vendor == "postgresql":
        assert paginator.count_is_estimate and paginator.count >= 4
        assert paginator.count_label.startswith("≈ ")
        [completed] = [
            s for s in response.context["af_dashboard"]["statuses"] if s["value"] == "COMPLETED"
        ]
        assert completed["approx"]
    else:
        assert paginator.count == 5


@pytest.mark.parametrize("read_all_limit", [10_000, 0], ids=["grouped-in-python", "index-probes"])
def test_date_drill_down__lists_only_periods_that_have_runs(
    admin_client: Client, monkeypatch, read_all_limit: int
) -> None:
    monkeypatch.setattr(dates, "READ_ALL_LIMIT", read_all_limit)
    now = timezone.localtime()
    make_run(RunStatus.COMPLETED)
    make_run(RunStatus.COMPLETED, created_ago=timedelta(days=400))

    years = admin_client.get(LIST_URL).context["af_dates"]
    months = admin_client.get(f"{LIST_URL}?created_at__year={now.year}").context["af_dates"]
    days = admin_client.get(
        f"{LIST_URL}?created_at__year={now.year}&created_at__month={now.month}"
    ).context["af_dates"]

    long_ago = now - timedelta(days=400)
    assert [c["title"] for c in years["choices"]] == [str(long_ago.year), str(now.year)]
    assert (
        len(months["choices"]) == 1
        and f"created_at__month={now.month}" in months["choices"][0]["link"]
    )
    assert [c["link"] for c in days["choices"]] == [
        f"?created_at__day={now.day}&created_at__month={now.month}&created_at__year={now.year}"
    ]


# --- Retry and Cancel ---------------------------------------------------------------------------
def test_retry__parked_run_resumes_records_the_operator_and_publishes_its_step(
    admin_client: Client, django_capture_on_commit_callbacks
) -> None:
    run = make_run(RunStatus.NEEDS_ATTENTION)

    with django_capture_on_commit_callbacks(execute=True) as published:
        response = admin_client.post(
            detail_url(run, "retry"), {"reason": "Stripe shows no payment (T-17)"}, follow=True
        )

    assert response.redirect_chain[-1][0] == detail_url(run)
    assert f"Run {run.pk} retried. It resumes at step #2 pretend_effect." in text(response)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.wake_at is not None
    event = run.events.get(kind=RunEvent.Kind.OPERATOR_RETRY)
    assert (event.actor, event.detail) == ("admin", "Stripe shows no payment (T-17)")
    # One step message (metrics add callbacks of their own after the commit).
    assert len([c for c in published if c.__qualname__.startswith("send_step")]) == 1
    if settings.CELERY_BROKER_URL.startswith("redis"):
        assert published_steps(run.pk) == [[run.pk, 2]]


def test_retry__completed_run_is_refused_with_a_message(admin_client: Client) -> None:
    run = make_run(RunStatus.COMPLETED)

    response = admin_client.post(detail_url(run, "retry"), {"reason": "try"}, follow=True)

    assert response.status_code == 200
    assert f"Run {run.pk} was not retried: only failed or parked runs can be retried" in text(
        response
    )
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED
    assert not run.events.exists()


def test_cancel__waiting_run_whose_effect_may_have_happened__the_partner_is_asked_first(
    admin_client: Client,
) -> None:
    """Its effect backs off (FAILED retryable): it may have happened, so the cancel is a
    request that a worker carries out once it has asked the partner (issue 19)."""
    run = make_run(RunStatus.WAITING)

    response = admin_client.post(
        detail_url(run, "cancel"), {"reason": "customer withdrew"}, follow=True
    )

    assert f"Run {run.pk}: cancel requested: whether pretend_effect took effect is unknown" in text(
        response
    )
    run.refresh_from_db()
    assert run.status == RunStatus.WAITING and run.cancel_requested
    event = run.events.get()
    assert (event.kind, event.actor, event.detail) == (
        "operator_cancel",
        "admin",
        "customer withdrew (requested: whether pretend_effect took effect is unknown; the "
        "partner is asked first)",
    )


def test_cancel__waiting_run_at_a_read__cancelled_with_an_event(admin_client: Client) -> None:
    run = make_run(RunStatus.WAITING, steps=1)  # greet, a read, backs off

    response = admin_client.post(
        detail_url(run, "cancel"), {"reason": "customer withdrew"}, follow=True
    )

    assert f"Run {run.pk} cancelled." in text(response)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.wake_at is None
    event = run.events.get()
    assert (event.kind, event.actor, event.detail) == (
        "operator_cancel",
        "admin",
        "customer withdrew",
    )


def test_cancel__step_in_flight__finishes_first_then_the_cancel_is_carried_out(
    admin_client: Client,
) -> None:
    """Undoing while an effect is in flight would undo blindly: the cancel is a request."""
    run = make_run(RunStatus.RUNNING)

    response = admin_client.post(
        detail_url(run, "cancel"), {"reason": "customer withdrew"}, follow=True
    )

    assert f"Run {run.pk}: cancel requested: pretend_effect is running" in text(response)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.cancel_requested
    event = run.events.get()
    assert event.kind == "operator_cancel" and event.detail.startswith("customer withdrew")


@pytest.mark.parametrize("reason", ["", "   ", "x" * 1001, "nul \x00 byte"])
def test_detail_action__needs_a_real_reason(admin_client: Client, reason: str) -> None:
    run = make_run(RunStatus.NEEDS_ATTENTION)

    response = admin_client.post(detail_url(run, "retry"), {"reason": reason})

    assert response.status_code == 200
    assert response.context["form"].errors
    run.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION and not run.events.exists()


def test_detail_action__get_shows_the_confirmation_page(admin_client: Client) -> None:
    run = make_run(RunStatus.FAILED)

    response = admin_client.get(detail_url(run, "retry"))

    assert response.status_code == 200
    assert 'name="reason"' in text(response) and run.pk in text(response)


def test_list_action__confirms_with_a_reason_then_reports_each_run(admin_client: Client) -> None:
    parked = make_run(RunStatus.NEEDS_ATTENTION)
    failed = make_run(RunStatus.FAILED)
    done = make_run(RunStatus.COMPLETED)
    chosen = {"action": "retry_runs", "_selected_action": [parked.pk, failed.pk, done.pk]}

    confirm = admin_client.post(LIST_URL, {**chosen, "index": 0})
    assert confirm.status_code == 200
    assert confirm.templates[0].name == actions.CONFIRMATION_TEMPLATE
    no_reason = admin_client.post(LIST_URL, {**chosen, "post": "yes", "reason": ""})
    assert no_reason.status_code == 200 and no_reason.context["form"].errors
    assert not RunEvent.objects.exists()

    response = admin_client.post(
        LIST_URL, {**chosen, "post": "yes", "reason": "batch fix"}, follow=True
    )

    page = text(response)
    assert "2 runs retried." in page
    assert f"Run {done.pk} was not retried: only failed or parked runs" in page
    statuses = dict(WorkflowRun.objects.values_list("pk", "status"))
    assert statuses == {parked.pk: "RUNNING", failed.pk: "RUNNING", done.pk: "COMPLETED"}
    assert set(RunEvent.objects.values_list("run_id", "actor", "detail")) == {
        (parked.pk, "admin", "batch fix"),
        (failed.pk, "admin", "batch fix"),
    }


def test_list_action__select_across_beyond_the_limit_is_refused(
    admin_client: Client, monkeypatch
) -> None:
    monkeypatch.setattr(actions, "MAX_RUNS_PER_ACTION", 2)
    for _ in range(3):
        make_run(RunStatus.RUNNING)

    response = admin_client.post(
        LIST_URL,
        {"action": "cancel_runs", "select_across": "1", "index": 0, "_selected_action": ["x"]},
        follow=True,
    )

    assert "Select at most 2 runs at a time" in text(response)
    assert not WorkflowRun.objects.filter(status=RunStatus.CANCELLED).exists()


# --- permissions and garbage ----------------------------------------------------------------
def test_viewer_without_change_permission__can_look_but_not_act(viewer: Client) -> None:
    run = make_run(RunStatus.NEEDS_ATTENTION)

    listing = viewer.get(LIST_URL)
    detail = viewer.get(detail_url(run))
    as_action = viewer.post(
        LIST_URL,
        {"action": "retry_runs", "_selected_action": [run.pk], "post": "yes", "reason": "r"},
        follow=True,
    )
    as_button = viewer.post(detail_url(run, "retry"), {"reason": "r"})
    as_edit = viewer.post(detail_url(run), {"status": "COMPLETED"})

    assert listing.status_code == 200 and "retry_runs" not in text(listing)
    assert detail.status_code == 200 and 'class="af-tool-retry"' not in text(detail)
    for cp in run.steps.all():  # the read-only inlines show for viewers too
        assert cp.idempotency_key in text(detail)
    assert as_action.status_code == 200  # no action is offered, so the list is shown again
    assert as_button.status_code == 403
    assert as_edit.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.NEEDS_ATTENTION and not run.events.exists()


def test_change_form_post__changes_nothing_and_says_why(admin_client: Client) -> None:
    run = make_run(RunStatus.FAILED)

    response = admin_client.post(
        detail_url(run), {"status": "COMPLETED", "_save": "Save"}, follow=True
    )

    assert "Workflow runs are read-only here" in text(response)
    before = run.updated_at
    run.refresh_from_db()
    assert (run.status, run.updated_at) == (RunStatus.FAILED, before)


@pytest.mark.parametrize(
    ("method", "path", "data"),
    [
        ("post", LIST_URL, {"action": "retry_runs", "_selected_action": ["nope", "' OR 1=1 --"]}),
        (
            "post",
            LIST_URL,
            {"action": "retry_runs", "_selected_action": ["nope"], "post": "yes", "reason": "r"},
        ),
        ("post", LIST_URL, {"action": "no_such_action", "_selected_action": ["nope"], "index": 0}),
        ("post", LIST_URL, {"action": ["retry_runs"], "index": "not-a-number"}),
        ("post", LIST_URL + "wf_5Fmissing/retry/", {"reason": "r"}),
        ("post", LIST_URL + "wf_5Fmissing/launch/", {"reason": "r"}),
        ("get", LIST_URL + "wf_5Fmissing/change/", {}),
        ("get", LIST_URL + "%00%ff/cancel/", {}),
        ("get", LIST_URL + "wf%00/change/", {}),
        ("get", LIST_URL + "?q=wf_%00&workflow=%00", {}),
        ("post", LIST_URL, {"action": "retry_runs", "_selected_action": ["a\x00"], "index": 0}),
        ("post", LIST_URL + "wf_5Fmissing/retry/", {"reason": "nul \x00 byte"}),
        ("put", LIST_URL + "wf_5Fmissing/retry/", {}),
        ("get", LIST_URL + "?created_at__year=2024&created_at__month=13", {}),
        ("get", LIST_URL + "?created_at__year=abc", {}),
        ("get", LIST_URL + "?wake=sometime&workflow=nope&status__exact=BOGUS", {}),
        ("get", LIST_URL + "?o=99&p=99999", {}),
        ("get", LIST_URL + "?q=" + "%" * 300, {}),
    ],
)
def test_garbage_requests__never_500(
    admin_client: Client, method: str, path: str, data: dict
) -> None:
    make_run(RunStatus.NEEDS_ATTENTION)

    response = getattr(admin_client, method)(path, data)

    assert response.status_code in (200, 302, 404, 405), text(response)[:500]
    assert not RunEvent.objects.exists()
