"""Sensitive arguments in the admin (issue 30): a call's declared-sensitive arguments are read by
those who decide it (approve + view runs) and by holders of the permission the declaration
names, and by nobody else, on any page of the run: everyone else reads "redacted (N
characters)" in their place, wherever a copy of the value went (the waiting call, the waits and
decisions, the events, a step's error, the timeline's hovers, the conversation). And Approve /
Reject of a call that declares replies ask what the customer is told apart from the reason,
and decide only once the operator confirmed a preview of those words. Real runs driven in this
process, real Postgres."""

from __future__ import annotations

import html
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow._core.sensitive import redacted
from agentflow.models import RunEvent, RunWait, StepCheckpoint, WorkflowRun
from agentflow.testing import run_to_end
from config import tracing as site_tracing
from tests.support import workflows
from tests.support.admin import detail_url, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

NOTE = 'My "father" died on Monday; the funeral in Zanzibar-ward-7 is <Friday> & I must go.'
MARK = "Zanzibar-ward-7"
HIDDEN = redacted(NOTE)
ROLES = {
    "viewer": ("view_workflowrun",),
    "approver_only": ("approve_workflowrun",),
    "approver": ("view_workflowrun", "approve_workflowrun"),
    "reader": ("view_workflowrun", "view_user"),  # workflows.CONFIDED_READERS
}
#: Who reads the note on the run's pages, and who on the approve page.
READS_RUN = {"approver", "reader"}
READS_APPROVE = {"approver"}


def as_role(role: str, username: str = "") -> Client:
    user = User.objects.create_user(username or role, password="x", is_staff=True)
    for codename in ROLES[role]:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def confided(**extra: object) -> WorkflowRun:
    run_id = durable.start(workflows.confided.name, input={"amount": 4500, "note": NOTE, **extra})
    assert run_to_end(run_id, retries=False).waiting_for == "approval"
    return WorkflowRun.objects.get(pk=run_id)


def shows_note(page: str) -> bool:
    return MARK in page or MARK in html.unescape(page)


def digest_of(run: WorkflowRun) -> str:
    found = durable.snapshot(run.pk)
    assert found is not None and found.pending_approval is not None
    return str(found.pending_approval["digest"])


@pytest.mark.parametrize("role", ROLES)
def test_waiting_run__the_note_read_by_deciders_and_readers_only(role: str) -> None:
    run = confided()
    client = as_role(role)

    page = client.get(detail_url(run))
    approve = client.get(detail_url(run, "approve"))

    if role == "approver_only":
        assert page.status_code == 403  # may decide, may not look at runs
    else:
        assert page.status_code == 200
        assert shows_note(text(page)) == (role in READS_RUN), role
        assert (HIDDEN in text(page)) == (role not in READS_RUN)
    if role in ("viewer", "reader"):
        assert approve.status_code == 403
    else:
        assert approve.status_code == 200 and "The call waiting for approval" in text(approve)
        assert shows_note(text(approve)) == (role in READS_APPROVE), role
        assert (HIDDEN in text(approve)) == (role not in READS_APPROVE)
        assert "&quot;amount&quot;: 4500" in text(approve)  # the rest of the call is shown


@pytest.mark.parametrize("role", ["viewer", "approver", "reader"])
def test_decided_run_that_failed_quoting_the_note__every_copy_redacted_for_viewers(
    role: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The note went into the decision's event, the next step's error, the run's error and so
    the timeline's hover on that step: a viewer reads none of them, and no log line has it."""
    run = confided(fail=True)
    durable.approve(run.pk, actor="ana", reason="checked", digest=digest_of(run))
    assert run_to_end(run.pk).status == RunStatus.FAILED
    page = text(as_role(role).get(detail_url(run)))

    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "failed permanently: the registry refused the note: redacted (" in logged
    assert MARK not in logged

    assert shows_note(page) == (role in READS_RUN)
    if role not in READS_RUN:
        assert page.count("redacted (") >= 4  # the waits, its events, the error, the timeline
        start = page.index("<svg", page.index('id="af-timeline-heading"'))
        svg = page[start : page.index("</svg>", start)]
        assert "the registry refused the note: redacted (" in svg  # the failed attempt's hover
    assert "approved</strong> by ana" in page and "checked" in page  # the decision itself shows


STORY = "The ward nurse, Ingrid-Q5, told me to stay in bed."


@pytest.mark.parametrize("role", ["viewer", "approver", "reader"])
def test_agent_run__the_conversation_and_the_call_redacted_for_viewers(role: str) -> None:
    """The tool's call (its sensitive note, also in the model's turn and the user message) and
    what its tool shows the approver besides (the story the model never sees)."""
    run_id = durable.start(workflows.confiding.name, input={"note": NOTE, "story": STORY})
    waiting = run_to_end(run_id, retries=False)
    assert waiting.waiting_for == "approval"
    assert waiting.pending_approval is not None
    assert waiting.pending_approval["arguments"] == {"claim": "c-1", "note": NOTE, "story": STORY}
    run = WorkflowRun.objects.get(pk=run_id)
    approve = text(as_role("approver", "deciding").get(detail_url(run, "approve")))
    assert "Ingrid-Q5" in approve and MARK in html.unescape(approve)
    durable.approve(run_id, actor="ana", reason="ok", digest=digest_of(run))
    assert run_to_end(run_id).status == RunStatus.COMPLETED

    page = text(as_role(role).get(detail_url(run)))

    assert "file_claim" in page and "c-1" in page  # the call and its other argument show
    assert shows_note(page) == (role in READS_RUN)
    assert ("Ingrid-Q5" in page) == (role in READS_RUN)
    if role not in READS_RUN:
        assert HIDDEN in page and redacted(STORY) in page
    model_turns = [
        json.dumps(cp.arguments) for cp in StepCheckpoint.objects.filter(run=run, kind="llm")
    ]
    assert model_turns and not any("Ingrid-Q5" in turn for turn in model_turns)


def test_fork_page__the_calls_it_sets_aside_shown_with_the_note_redacted_to_an_operator() -> None:
    """An operator (the change permission, not the approve one) may fork a failed agent run:
    the calls a fork would set aside are listed, their sensitive arguments redacted."""
    run_id = durable.start(workflows.confiding.name, input={"note": NOTE, "fail": True})
    run_to_end(run_id, retries=False)
    run = WorkflowRun.objects.get(pk=run_id)
    durable.approve(run_id, actor="ana", reason="ok", digest=digest_of(run))
    assert run_to_end(run_id).status == RunStatus.FAILED
    operator = Client()
    user = User.objects.create_user("operator", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="change_workflowrun"))
    operator.force_login(user)

    fork = operator.get(detail_url(run, "fork") + "?position=1")

    assert fork.status_code == 200 and "Fork this run from position 1?" in text(fork)
    assert "file_claim" in text(fork) and HIDDEN in text(fork)
    assert not shows_note(text(fork))


def test_a_park_with_the_note_in_its_reason__logged_masked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = confided()

    assert store.run_park(run.pk, run.current_seq, f"check the note: {NOTE}", fence=None)

    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert f"needs attention: check the note: {HIDDEN}" in logged and MARK not in logged


def test_a_workflow_declaring_nothing__shown_to_every_viewer_as_before() -> None:
    run_id = durable.start(workflows.approval.name, input={"amount": 4500})
    run_to_end(run_id, retries=False)

    page = text(as_role("viewer").get(detail_url(WorkflowRun.objects.get(pk=run_id))))

    assert "&quot;amount&quot;: 4500" in page and "redacted (" not in page


# --- logs, traces and metrics -----------------------------------------------------------------
@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = site_tracing.configure(exporter=exporter)
    assert provider is not None
    try:
        yield exporter
    finally:
        provider.shutdown()
        # OpenTelemetry sets its global provider once a process; a test takes it back.
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = None


def test_logs_traces_and_metrics__never_carry_the_note(
    spans: InMemorySpanExporter, caplog: pytest.LogCaptureFixture, settings: Any
) -> None:
    """A run that waits with the note, is approved and fails quoting it: nothing it logged,
    traced or counted holds the note."""
    run = confided(fail=True)
    durable.approve(run.pk, actor="ana", reason="checked", digest=digest_of(run))
    assert run_to_end(run.pk).status == RunStatus.FAILED
    settings.AGENTFLOW_METRICS_PUBLIC = True

    scraped = Client().get("/metrics").content.decode()
    traced = [
        json.dumps(
            [
                s.name,
                dict(s.attributes or {}),
                [(e.name, dict(e.attributes or {})) for e in s.events],
            ],
            default=str,
        )
        for s in spans.get_finished_spans()
    ]
    logged = [record.getMessage() + (record.exc_text or "") for record in caplog.records]

    assert traced and any(run.pk in t for t in traced)  # the run was traced
    assert "agentflow_" in scraped  # and counted
    for said in (scraped, *traced, *logged):
        assert MARK not in said and html.escape(NOTE) not in said


# --- what the customer is told, apart from the reason ------------------------------------------
def test_reject__asks_the_reason_and_the_customers_words_apart_and_previews_them() -> None:
    run = confided()
    client = as_role("approver")

    form = text(client.get(detail_url(run, "reject")))
    preview = client.post(
        detail_url(run, "reject"),
        {
            "reason": "INTERNAL fraud flag on acct 4411",
            "reply": "We couldn't approve it without documents.",
            "digest": digest_of(run),
        },
    )

    assert "Told to the customer" in form and "never shown to the customer" in form
    for sentence in workflows.REPLIES.reject:
        assert html.escape(sentence, quote=False) in form or html.escape(sentence) in form
    assert "Approved: nothing to pay." not in form  # the other outcome's sentences
    assert preview.status_code == 200
    shown = text(preview)
    assert "this is what the customer reads" in shown
    assert "We couldn&#x27;t approve it without documents." in shown
    assert RunWait.objects.get(run=run).resolved_at is None  # nothing decided by a preview

    done = client.post(
        detail_url(run, "reject"),
        {
            "reason": "INTERNAL fraud flag on acct 4411",
            "reply": "We couldn't approve it without documents.",
            "digest": digest_of(run),
            "confirmed": "yes",
        },
    )

    assert done.status_code == 302
    wait = RunWait.objects.get(run=run)
    assert wait.reason == "INTERNAL fraud flag on acct 4411"
    assert wait.outcome["reply"] == "We couldn't approve it without documents."
    event = RunEvent.objects.get(run=run, kind=RunEvent.Kind.OPERATOR_REJECT)
    assert event.data["reply"] == "We couldn't approve it without documents."
    finished = run_to_end(run.pk)
    assert [s.name for s in finished.steps][-1] == "declined"
    consider = next(s for s in finished.steps if s.name == "consider")
    assert consider.output["reply"] == "We couldn't approve it without documents."
    assert "told the customer: “We couldn" in text(client.get(detail_url(run)))


def test_approve__in_the_operators_own_words__previewed_then_recorded_as_typed() -> None:
    run = confided()
    client = as_role("approver")
    fields = {
        "reason": "met the policy",
        "reply": "__own_words__",
        "own_words": "  Approved — take care of yourself.\n",
        "digest": digest_of(run),
    }

    missing = client.post(detail_url(run, "approve"), {**fields, "own_words": " "})
    preview = client.post(detail_url(run, "approve"), fields)
    edit = client.post(detail_url(run, "approve"), {**fields, "confirmed": "yes", "edit": "1"})
    client.post(detail_url(run, "approve"), {**fields, "confirmed": "yes"})

    assert "Write what the customer is told" in text(missing)
    assert "Approved — take care of yourself." in text(preview)
    assert 'name="own_words"' in text(edit) and "take care of yourself" in text(edit)
    assert 'type="radio"' in text(edit)  # back to the form, nothing decided by it
    wait = RunWait.objects.get(run=run)
    assert wait.outcome["approved"] and wait.outcome["reply"] == "Approved — take care of yourself."
    done = run_to_end(run.pk)
    assert next(s for s in done.steps if s.name == "consider").output["reply"] == (
        "Approved — take care of yourself."
    )


def test_reject__a_sentence_not_offered__refused_and_nothing_decided() -> None:
    run = confided()

    posted = as_role("approver").post(
        detail_url(run, "reject"),
        {"reason": "no", "reply": "Anything I like", "digest": digest_of(run), "confirmed": "yes"},
    )

    assert posted.status_code == 200 and "errorlist" in text(posted)
    assert RunWait.objects.get(run=run).resolved_at is None


def test_agent_tool__its_decision_reply_reaches_the_tool_and_the_models_rejection() -> None:
    run_id = durable.start(workflows.confiding.name, input={"note": NOTE})
    run_to_end(run_id, retries=False)
    run = WorkflowRun.objects.get(pk=run_id)
    durable.reject(
        run_id,
        actor="ana",
        reason="internal",
        digest=digest_of(run),
        reply="We couldn't approve it.",
    )

    done = run_to_end(run_id)

    assert done.status == RunStatus.COMPLETED
    rejected = next(s for s in done.steps if s.name == "file_claim").output["result"]
    assert rejected == {
        "rejected": True,
        "reason": "internal",
        "timed_out": False,
        "reply": "We couldn't approve it.",
    }
