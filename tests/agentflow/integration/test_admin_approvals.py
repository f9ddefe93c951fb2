"""Approve and Reject in the admin (docs/workflows.md, "Timers, signals and approvals"): offered
only to holders of `agentflow.approve_workflowrun` and only while a call waits, each asking for a
reason and recorded with the operator; the run page and the dashboard show the waiting call and
every decision. Real runs driven in this process, real Postgres."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow.models import RunEvent, RunWait, WorkflowRun
from agentflow.testing import run_to_end
from tests.support import workflows
from tests.support.admin import LIST_URL, detail_url, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def staff(client: Client, name: str, *codenames: str) -> Client:
    user = User.objects.create_user(name, password="x", is_staff=True)
    for codename in ("view_workflowrun", *codenames):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    return client


@pytest.fixture
def approver(client: Client) -> Client:
    return staff(client, "approver", "approve_workflowrun")


@pytest.fixture
def operator(client: Client) -> Client:
    return staff(client, "operator", "change_workflowrun")


def waiting_for_approval(amount: int = 4500) -> WorkflowRun:
    run_id = durable.start(workflows.approval.name, input={"amount": amount})
    found = run_to_end(run_id, retries=False)
    assert found.waiting_for == "approval"
    return WorkflowRun.objects.get(pk=run_id)


def test_run_page__shows_the_call_waiting_for_approval_and_the_buttons(approver: Client) -> None:
    run = waiting_for_approval()

    page = text(approver.get(detail_url(run)))

    assert "Waiting for approval" in page
    assert (
        "<strong>Waiting for approval:</strong> the run stopped before it makes this call" in page
    )
    assert "could not be drawn" not in page  # the timeline of a waiting run
    assert 'class="af-tool-approve"' in page and 'class="af-tool-reject"' in page
    assert 'class="af-tool-retry"' not in page  # operating needs the change permission
    assert "Waits for approval of" in page and "<code>charge</code>" in page
    assert "&quot;amount&quot;: 4500" in page or '"amount": 4500' in page


def test_operator_without_the_approve_permission__sees_no_button_and_gets_403(
    operator: Client,
) -> None:
    run = waiting_for_approval()

    page = text(operator.get(detail_url(run)))
    posted = operator.post(detail_url(run, "approve"), {"reason": "looks fine"})

    assert 'class="af-tool-approve"' not in page and 'class="af-tool-cancel"' in page
    assert posted.status_code == 403
    assert run.waits.get().resolved_at is None


def shown_digest(run: WorkflowRun) -> str:
    """The digest of the call the confirmation page shows (its hidden field carries it)."""
    found = durable.snapshot(run.pk)
    assert found is not None and found.pending_approval is not None
    return str(found.pending_approval["digest"])


def test_approve__confirmation_shows_the_call__the_decision_is_recorded_with_operator_and_reason(
    approver: Client,
) -> None:
    run = waiting_for_approval()

    confirm = text(approver.get(detail_url(run, "approve")))
    digest = shown_digest(run)
    assert f'name="digest" value="{digest}"' in approver.get(detail_url(run, "approve")).text
    done = approver.post(
        detail_url(run, "approve"), {"reason": "fee confirmed by phone", "digest": digest}
    )

    assert "The call waiting for approval" in confirm and "charge" in confirm and "4500" in confirm
    assert done.status_code == 302 and done["Location"].endswith(detail_url(run))
    event = RunEvent.objects.get(run=run, kind=RunEvent.Kind.OPERATOR_APPROVE)
    assert (event.actor, event.detail) == ("approver", "fee confirmed by phone")
    wait = run.waits.get()
    assert (wait.actor, wait.reason, wait.outcome["approved"]) == (
        "approver",
        "fee confirmed by phone",
        True,
    )
    assert run_to_end(run.pk).status == RunStatus.COMPLETED
    page = text(approver.get(detail_url(run)))
    assert "approved</strong> by approver" in page and "fee confirmed by phone" in page


def test_reject__recorded_and_the_run_takes_its_rejected_branch(approver: Client) -> None:
    run = waiting_for_approval()

    approver.post(
        detail_url(run, "reject"), {"reason": "not eligible", "digest": shown_digest(run)}
    )
    done = run_to_end(run.pk)

    assert [s.name for s in done.steps] == ["prepare", "charge", "declined"]
    event = RunEvent.objects.get(run=run, kind=RunEvent.Kind.OPERATOR_REJECT)
    assert (event.actor, event.detail) == ("approver", "not eligible")
    assert "rejected</strong> by approver" in text(approver.get(detail_url(run)))


@pytest.mark.parametrize("reason", ["", "   ", "x" * 1001])
def test_approve__without_a_real_reason__asks_again_and_records_nothing(
    approver: Client, reason: str
) -> None:
    run = waiting_for_approval()

    response = approver.post(detail_url(run, "approve"), {"reason": reason})

    assert response.status_code == 200 and "errornote" in text(response)
    assert run.waits.get().resolved_at is None


def test_approve__a_run_that_waits_for_nothing__says_so_without_a_traceback(
    approver: Client,
) -> None:
    run_id = durable.start(workflows.approval.name, input={"amount": 10})
    run_to_end(run_id)
    run = WorkflowRun.objects.get(pk=run_id)

    shown = approver.get(detail_url(run, "approve"), follow=True)
    posted = approver.post(detail_url(run, "approve"), {"reason": "ok"}, follow=True)
    missing = approver.post(f"{LIST_URL}wf_nope/approve/", {"reason": "ok"}, follow=True)
    garbage = approver.get(f"{LIST_URL}wf_%00x/reject/", follow=True)

    assert shown.status_code == 200 and "waits for no approval now" in text(shown)
    assert posted.status_code == 200 and "was not approved: the run is finished" in text(posted)
    assert missing.status_code == 200 and "There is no workflow run" in text(missing)
    assert garbage.status_code == 200
    assert not RunEvent.objects.filter(run=run, kind=RunEvent.Kind.OPERATOR_APPROVE).exists()


def test_dashboard__counts_runs_waiting_for_approval_with_the_oldest_age(
    admin_client: Client,
) -> None:
    waiting_for_approval()
    waiting_for_approval(amount=2000)
    RunWait.objects.update(requested_at=RunWait.objects.first().requested_at)  # (same age)

    page = text(admin_client.get(LIST_URL))
    filtered = text(admin_client.get(f"{LIST_URL}?wake=approval"))

    assert "Waiting for approval" in page
    assert 'href="/admin/agentflow/workflowrun/?wake=approval">2</a>' in page
    assert "the oldest for" in page
    assert filtered.count('class="af-badge af-waiting">Waiting for approval') == 2


def test_approve__the_call_replaced_while_the_page_was_open__refused_and_nothing_decided(
    approver: Client,
) -> None:
    """The approver reads the call for 4500; before she presses Approve, the call at the
    position is replaced by one for 9900 (another operator's decision on 4500, then the call
    changed). Her POST names what she saw: it is refused, and 9900 still waits for a decision."""
    run = waiting_for_approval(4500)
    seen = shown_digest(run)
    durable.approve(run.pk, actor="bob", reason="for 4500")
    WorkflowRun.objects.filter(pk=run.pk).update(input={"amount": 9900})
    assert run_to_end(run.pk, retries=False).pending_approval["arguments"] == {"amount": 9900}

    posted = approver.post(
        detail_url(run, "approve"), {"reason": "fee confirmed", "digest": seen}, follow=True
    )

    assert "was not approved: the call waiting for approval is not the one you were shown" in (
        text(posted)
    )
    assert RunWait.objects.get(run=run).resolved_at is None  # 9900: nobody decided it
    assert not RunEvent.objects.filter(run=run, actor="approver").exists()
    with pytest.raises(durable.ActionRefused, match="not the one you were shown"):
        durable.reject(run.pk, actor="carol", reason="stale", digest=seen)


def test_approve__a_post_naming_no_call__refused(approver: Client) -> None:
    run = waiting_for_approval()

    posted = approver.post(detail_url(run, "approve"), {"reason": "ok"}, follow=True)

    assert "was not approved" in text(posted)
    assert RunWait.objects.get(run=run).resolved_at is None


def test_run_page__signals__which_wait_took_each__one_none_took_stays_listed_as_kept(
    approver: Client,
) -> None:
    run_id = durable.start(workflows.signalled.name)
    durable.signal(run_id, "reply", {"text": "yes"}, signal_id="sms-1")  # early: kept, then taken
    durable.signal(run_id, "unasked", {"text": "hello?"}, signal_id="sms-2")  # no wait for it
    done = run_to_end(run_id)
    assert done.status == RunStatus.COMPLETED, done.error

    page = text(approver.get(detail_url(WorkflowRun.objects.get(pk=run_id))))

    assert 'class="af-waits af-signals"' in page
    rows = page.split('class="af-waits af-signals"')[1].split("</table>")[0].split("<tr>")[2:]
    newest, oldest = rows
    assert "<code>sms-2</code>" in newest and "kept: no wait_for(unasked) has taken it" in newest
    assert "<code>sms-1</code>" in oldest and "the wait at #2" in oldest
    assert "taken at once, sent earlier (sms-1)" in page  # on the timeline too
