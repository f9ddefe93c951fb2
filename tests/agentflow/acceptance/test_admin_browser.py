"""An operator in a real Chromium works the admin console against real worker processes.

Real pieces: the web app (pytest-django's live server), Celery worker processes running the
test workflows, a private Redis broker, Postgres and the partner stand-in. The operator logs
in, filters, reads the timeline, and retries, cancels or resumes runs; the workers do the rest.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User

from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow.models import RunEvent, WorkflowRun
from agentflow.testing.waiting import wait_for
from tests.support import partner, workflows
from tests.support.admin import LIST_URL, make_run
from tests.support.browser import db
from tests.support.processes import Workers

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PASSWORD = "correct horse battery staple"
#: Generous: a cold worker on two shared cores.
RUN_SECONDS = 60


# --- set-up and reading -------------------------------------------------------------------------
def operator_user(name: str = "ops-ana", *, can_act: bool = True) -> None:
    def create() -> None:
        if can_act:
            User.objects.create_superuser(name, f"{name}@example.com", PASSWORD)
            return
        user = User.objects.create_user(name, password=PASSWORD, is_staff=True)
        user.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))

    db(create)


def log_in(page: Any, name: str = "ops-ana") -> None:
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", name)
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/admin/")


def start(workflow: durable.Workflow) -> str:
    return db(lambda: durable.start(workflow.name))


def status_of(run_id: str) -> str:
    return db(lambda: WorkflowRun.objects.get(pk=run_id).status)


def wait_status(run_id: str, status: str, *, timeout: float = RUN_SECONDS) -> None:
    wait_for(lambda: status_of(run_id) == status, timeout=timeout, what=f"{run_id} to be {status}")


def run_url(run_id: str) -> str:
    return f"{LIST_URL}{quote(run_id)}/change/"


def shown_status(page: Any) -> str:
    return page.locator(".field-status_badge .readonly").inner_text().strip()


def watch_until(page: Any, label: str, *, timeout: float = RUN_SECONDS) -> None:
    """Reload the run page (it does not refresh itself) until its status reads `label`."""

    def shows() -> bool:
        page.reload()
        return shown_status(page) == label

    wait_for(shows, timeout=timeout, interval=0.5, what=f"the run page to say {label}")


def act(page: Any, verb: str, reason: str) -> None:
    """Press the run page's button for `verb`, give the reason, confirm."""
    page.locator(f"a.af-tool-{verb}").click()
    page.get_by_label("Reason:").fill(reason)
    page.locator('.submit-row input[type="submit"]').click()
    page.wait_for_url("**/change/")


def lanes(page: Any) -> dict[str, list[str]]:
    """Outcomes of each step's attempts, as the timeline on the page draws them."""
    svg = page.locator("svg.af-timeline-svg")
    assert svg.is_visible()
    found: dict[str, list[str]] = {}
    for lane in svg.locator("g.af-tl-lane[data-step]").all():
        found[lane.get_attribute("data-step")] = [
            a.get_attribute("data-outcome") for a in lane.locator("g.af-tl-attempt").all()
        ]
    return found


def marks(page: Any) -> list[str]:
    return [
        m.get_attribute("data-kind") for m in page.locator("svg.af-timeline-svg g.af-tl-mark").all()
    ]


# --- the operator's journeys --------------------------------------------------------------------
def test_operator__filters_to_failed_reads_the_timeline_retries_and_watches_it_complete(
    workers: Workers, page: Any
) -> None:
    workers.start(concurrency=2)
    done = start(workflows.chain)
    failed = start(workflows.gated)
    wait_status(done, RunStatus.COMPLETED)
    wait_status(failed, RunStatus.FAILED)
    operator_user()
    log_in(page)

    page.goto(LIST_URL)
    page.locator("#changelist-filter").get_by_role("link", name="Failed", exact=True).click()
    page.wait_for_url("**status__exact=FAILED**")
    listed = page.locator("#result_list tbody th a").all_inner_texts()
    assert listed == [failed]
    page.get_by_role("link", name=failed).click()

    assert shown_status(page) == "Failed"
    assert lanes(page) == {"prepare": ["completed"], "charge": ["failed"]}
    partner.release(failed)  # the partner fixed the account: now a retry can work
    act(page, "retry", "Partner unlocked the account (T-42)")
    assert f"Run {failed} retried." in page.locator(".messagelist").inner_text()
    watch_until(page, "Completed")

    assert lanes(page)["charge"] == ["failed", "completed"]
    assert lanes(page)["finish"] == ["completed"]
    assert "operator" in marks(page)
    event = db(lambda: RunEvent.objects.get(run_id=failed, kind=RunEvent.Kind.OPERATOR_RETRY))
    assert (event.actor, event.detail) == ("ops-ana", "Partner unlocked the account (T-42)")


def test_operator__cancels_a_running_run(workers: Workers, page: Any) -> None:
    workers.start()
    run_id = start(workflows.held)
    wait_for(
        lambda: any(e["step"] == "hold" for e in partner.executions(run_id)),
        timeout=RUN_SECONDS,
        what="the held step to start",
    )
    operator_user()
    log_in(page)
    page.goto(run_url(run_id))
    assert shown_status(page) == "Running"
    assert lanes(page)["hold"] == ["running"]

    act(page, "cancel", "Customer withdrew the request")

    # The step in flight finishes first (undoing it blindly could keep money), then the worker
    # carries the cancel out instead of running the next step.
    said = page.locator(".messagelist").inner_text()
    assert f"Run {run_id}: cancel requested: hold is running and finishes first" in said
    assert shown_status(page) == "Running"
    partner.release(run_id)
    watch_until(page, "Cancelled")
    assert not any(e["step"] == "finish" for e in partner.executions(run_id))
    assert partner.effects()[durable.idempotency_key(run_id, 2)] == 1


def test_operator__resumes_a_waiting_run_now(workers: Workers, page: Any) -> None:
    workers.start()
    run_id = start(workflows.dormant)
    wait_status(run_id, RunStatus.WAITING)  # its retry is an hour away
    operator_user()
    log_in(page)
    page.goto(run_url(run_id))
    assert shown_status(page) == "Waiting to retry"
    assert "retry due" in page.locator("svg.af-timeline-svg").text_content()

    act(page, "resume", "Partner is back; customer waiting")
    assert f"Run {run_id} resumed." in page.locator(".messagelist").inner_text()
    watch_until(page, "Completed")

    charges = [e for e in partner.executions(run_id) if e["step"] == "charge"]
    assert [e["attempt"] for e in charges] == [1, 2]
    event = db(lambda: RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.OPERATOR_RESUME))
    assert (event.actor, event.seq) == ("ops-ana", 1)
    assert event.detail == "Partner is back; customer waiting"
    assert "operator" in marks(page)
    assert lanes(page)["charge"] == ["retried", "completed"]
    # The hour's back-off ends where the resumed attempt began, not an hour later.
    waits = page.locator("svg.af-timeline-svg g.af-tl-wait title").all_text_contents()
    assert len(waits) == 1 and waits[0].startswith("back-off, cut short")


def test_operator__forks_a_diverged_agent_run_from_the_diverged_position_and_it_completes(
    workers: Workers, page: Any
) -> None:
    workers.start(concurrency=2)
    run_id = start(workflows.drift_agent)
    wait_for(
        lambda: any(e["step"] == "buy" for e in partner.executions(run_id)),
        timeout=RUN_SECONDS,
        what="the agent's buy to start",
    )
    partner.release(workflows.prompt_changed(run_id))  # a new prompt is deployed under it
    partner.release(f"{run_id}/buy")
    wait_status(run_id, RunStatus.NEEDS_ATTENTION)  # the next task's replay diverged at turn 2
    key = durable.idempotency_key(run_id, 5)
    operator_user()
    log_in(page)

    page.goto(run_url(run_id))
    assert shown_status(page) == "Needs attention"
    diff = page.locator("#af-divergence")
    said = diff.inner_text()
    assert "Diverged at position 4" in said
    assert "Position 4 diverged: the model turn (scripted-shopper) changed." in said
    assert "arguments.messages[5]" in said and workflows.PRICES_NOTE in said
    assert "diverged" in marks(page)
    diff.get_by_role("link", name="Fork from position 4…").click()

    page.wait_for_url("**/fork/?position=4")
    effects = page.locator(".af-fork-effects").inner_text()
    assert "1 side effect of the part set aside happened" in effects
    assert "buy" in effects and key in effects
    page.get_by_label("Reason:").fill("The new prompt is meant (T-77)")
    page.get_by_role("button", name="Fork from position 4").click()
    page.wait_for_url("**/change/")
    said = page.locator(".messagelist").inner_text()
    assert f"Run {run_id}: forked from position 4; it continues there on branch 1." in said
    watch_until(page, "Completed")

    assert partner.effects() == {key: 1}  # the buy was adopted by the new branch, not repeated
    branch = page.locator("details.af-branch")
    branch.locator("summary").click()
    assert "superseded by the fork of" in branch.inner_text()
    assert "by ops-ana" in branch.inner_text()
    assert "Adopted by the new branch at #5: not made again." in branch.inner_text()
    final = page.locator(".af-trajectory > .af-convo > li.af-call").last
    assert "Bought 2 apples at $3." in final.inner_text()
    assert "fork" in marks(page)
    event = db(lambda: RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.FORK))
    assert (event.actor, event.seq) == ("ops-ana", 4)
    assert event.detail.startswith("The new prompt is meant (T-77)")


def test_viewer__sees_no_action_buttons_and_a_forged_post_is_refused(page: Any) -> None:
    parked = db(lambda: make_run(RunStatus.NEEDS_ATTENTION).pk)
    waiting = db(lambda: make_run(RunStatus.WAITING).pk)
    operator_user("viewer-vic", can_act=False)
    log_in(page, "viewer-vic")

    page.goto(LIST_URL)
    assert page.locator("select[name=action]").count() == 0
    for run_id in (parked, waiting):
        page.goto(run_url(run_id))
        assert page.locator("svg.af-timeline-svg").is_visible()  # may look...
        assert page.locator("a[class^='af-tool-']").count() == 0  # ...not act

    forged = page.evaluate(
        """async ([url, listUrl, runId]) => {
            const token = document.cookie.match(/csrftoken=([^;]+)/)[1];
            const post = (to, fields) => fetch(to, {
                method: "POST", credentials: "same-origin",
                body: new URLSearchParams({csrfmiddlewaretoken: token, ...fields}),
            }).then(r => r.status);
            return [
                await post(url + "retry/", {reason: "forged"}),
                await post(url + "resume/", {reason: "forged"}),
                await post(url + "cancel/", {reason: "forged"}),
                await post(url + "fork/", {position: "1", reason: "forged"}),
                await post(listUrl, {action: "retry_runs", _selected_action: runId,
                                     post: "yes", reason: "forged"}),
            ];
        }""",
        [f"{LIST_URL}{quote(parked)}/", LIST_URL, parked],
    )

    assert forged[:4] == [403, 403, 403, 403]
    assert forged[4] == 200  # the list again: no such action for this user
    assert db(lambda: WorkflowRun.objects.get(pk=parked).status) == RunStatus.NEEDS_ATTENTION
    assert db(lambda: WorkflowRun.objects.get(pk=waiting).status) in ACTIVE_RUN_STATUSES
    assert not db(RunEvent.objects.exists)


# --- approvals (docs/workflows.md, "Timers, signals and approvals") -------------------------------
def approver_user(name: str, *, may_decide: bool) -> None:
    """Staff who may look and operate, and (with `may_decide`) approve or reject."""

    def create() -> None:
        user = User.objects.create_user(name, password=PASSWORD, is_staff=True)
        codenames = ["view_workflowrun", "change_workflowrun"]
        if may_decide:
            codenames.append("approve_workflowrun")
        for codename in codenames:
            user.user_permissions.add(Permission.objects.get(codename=codename))

    db(create)


def start_charge(amount: int) -> str:
    return db(lambda: durable.start(workflows.approval.name, input={"amount": amount}))


def waiting_for_approval(run_id: str) -> None:
    def waits() -> bool:
        found = db(lambda: durable.snapshot(run_id))
        return found is not None and found.waiting_for == "approval"

    wait_for(waits, timeout=RUN_SECONDS, what=f"{run_id} to wait for approval")


def test_approver__sees_the_waiting_charge_approves_one_rejects_another(
    workers: Workers, page: Any
) -> None:
    workers.start()
    approved, rejected = start_charge(4500), start_charge(9900)
    waiting_for_approval(approved)
    waiting_for_approval(rejected)
    approver_user("ops-amy", may_decide=True)
    log_in(page, "ops-amy")

    page.goto(f"{LIST_URL}?wake=approval")
    assert sorted(page.locator("#result_list tbody th a").all_inner_texts()) == sorted(
        [approved, rejected]
    )
    page.goto(run_url(approved))
    assert shown_status(page) == "Waiting for approval"
    assert '"amount": 4500' in page.locator(".field-pending_block").inner_text()
    page.locator("a.af-tool-approve").click()
    assert "4500" in page.locator(".af-pending-call").inner_text()
    page.get_by_label("Reason:").fill("Fee confirmed by phone (T-9)")
    page.locator('.submit-row input[type="submit"]').click()
    page.wait_for_url("**/change/")
    assert f"Run {approved} approved." in page.locator(".messagelist").inner_text()
    watch_until(page, "Completed")
    assert "approved by ops-amy" in page.locator(".field-waits_block").inner_text()

    page.goto(run_url(rejected))
    act(page, "reject", "Not eligible for a refund of this fare")
    watch_until(page, "Completed")
    assert "rejected by ops-amy" in page.locator(".field-waits_block").inner_text()

    assert partner.effects()[durable.idempotency_key(approved, 2)] == 1
    assert durable.idempotency_key(rejected, 2) not in partner.effects()
    decided = db(
        lambda: list(
            RunEvent.objects.filter(
                kind__in=[RunEvent.Kind.OPERATOR_APPROVE, RunEvent.Kind.OPERATOR_REJECT]
            ).values_list("run_id", "kind", "actor", "detail")
        )
    )
    assert sorted(decided) == sorted(
        [
            (approved, "operator_approve", "ops-amy", "Fee confirmed by phone (T-9)"),
            (rejected, "operator_reject", "ops-amy", "Not eligible for a refund of this fare"),
        ]
    )


def test_operator_without_the_approve_permission__sees_no_approve_button_and_a_forged_post_fails(
    workers: Workers, page: Any
) -> None:
    workers.start()
    run_id = start_charge(4500)
    waiting_for_approval(run_id)
    approver_user("ops-olga", may_decide=False)
    log_in(page, "ops-olga")

    page.goto(run_url(run_id))
    assert shown_status(page) == "Waiting for approval"
    assert page.locator("a.af-tool-cancel").count() == 1  # she may operate...
    assert page.locator("a.af-tool-approve, a.af-tool-reject").count() == 0  # ...not decide
    forged = page.evaluate(
        """async (url) => {
            const token = document.cookie.match(/csrftoken=([^;]+)/)[1];
            const post = (to) => fetch(to, {
                method: "POST", credentials: "same-origin",
                body: new URLSearchParams({csrfmiddlewaretoken: token, reason: "forged"}),
            }).then(r => r.status);
            return [await post(url + "approve/"), await post(url + "reject/")];
        }""",
        f"{LIST_URL}{quote(run_id)}/",
    )

    assert forged == [403, 403]
    found = db(lambda: durable.snapshot(run_id))
    assert found is not None and found.waiting_for == "approval"
