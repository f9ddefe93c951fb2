"""What an operator types stays internal, and a customer's health details are read only by those
who decide (issue 30), with real worker processes and the real partner sandbox.

- A waiver rejected in the admin with an internal note as the reason, by an operator with a
  username of their own: neither the note nor the name is in `status.json`, on the status page
  or in any e-mail; the customer is told the policy's sentence the operator chose, or the words
  they wrote for the customer, which the admin showed them in a preview before deciding.
- Every admin page of a waiting and of a decided run, fetched as each role — view-only,
  approver-only, approver + view, domain viewer — shows the customer's details only to the
  approver who may view runs and to the domain viewer, and "redacted (N characters)" to everyone
  else; the worker's log and /metrics never carry them.
- `status.json` keeps the shape of docs/refunds.md, "The status page", `customer` included, and
  holds no internal text.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.test import Client

from agentflow import durable
from agentflow._core.sensitive import redacted
from agentflow.models import RunWait
from agentflow.testing.processes import WorkerProcess
from agentflow.testing.waiting import wait_for
from refunds import policy, wording
from refunds.models import RefundRequest
from tests.support.admin import LIST_URL
from tests.support.refunds import finished, partner_effects, refund_worker_env, submit
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

ENGINES = ["graph", "agent"]
DETAILS = "I was admitted to St Olav ward 7C with pneumonia-x9 on Sunday; I cannot fly."
MARK = "pneumonia-x9"
NOTE = "INTERNAL fraud flag on acct 4411, see ticket OPS-99731"
OPERATOR = "jane.doe.ops"
INTERNAL = (NOTE, "OPS-99731", "acct 4411", OPERATOR)
ROLES = {
    "view_only": ("view_workflowrun",),
    "approver_only": ("approve_workflowrun",),
    "approver_and_view": ("view_workflowrun", "approve_workflowrun"),
    "domain_viewer": ("view_workflowrun", "view_refundrequest"),
}
#: Who reads the details: on the run's pages, and on the approve page.
READ_RUN = {"approver_and_view", "domain_viewer"}
READ_APPROVE = {"approver_and_view"}
StartWorker = Callable[[], WorkerProcess]


@pytest.fixture
def start_worker(clean_sandbox: SandboxProcess, transactional_db: None) -> Iterator[StartWorker]:
    """A worker with its beat running refunds of either engine against the sandbox; SIGKILLed
    at teardown, before the test database is flushed."""
    started: list[WorkerProcess] = []

    def start() -> WorkerProcess:
        worker = WorkerProcess(concurrency=2, env=refund_worker_env(clean_sandbox), beat=True)
        started.append(worker)
        return worker.start(timeout=60)

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()


def as_role(role: str, username: str | None = None) -> Client:
    user = User.objects.create_user(username or role, password="x", is_staff=True)
    for codename in ROLES[role]:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def waiting_for_approval(run_id: str, worker: WorkerProcess) -> durable.RunSnapshot:
    def waiting() -> durable.RunSnapshot | None:
        assert worker.alive(), worker.log_tail()
        run = durable.snapshot(run_id)
        assert run is not None and not run.finished, run
        return run if run.waiting_for == "approval" else None

    return wait_for(waiting, timeout=90, what=f"run {run_id} to wait for approval")


def run_url(run_id: str, page: str = "change") -> str:
    return f"{LIST_URL}{quote(run_id)}/{page}/"


def refund_of(run_id: str) -> RefundRequest:
    return RefundRequest.objects.get(workflow_id=run_id)


def customer_pages(run_id: str) -> dict[str, str]:
    """What the customer can read: the status page, status.json, and every e-mail sent them."""
    refund = refund_of(run_id)
    client = Client()
    return {
        "status page": client.get(f"/refunds/{refund.public_id}/").content.decode(),
        "status.json": client.get(f"/refunds/{refund.public_id}/status.json").content.decode(),
    }


def decide_in_the_admin(
    client: Client, run_id: str, verb: str, *, reply: str, own_words: str = ""
) -> str:
    """The operator opens the run's Approve or Reject page, gives their internal reason and
    what the customer is told, reads the preview and confirms. Returns the preview page."""
    run = durable.snapshot(run_id)
    assert run is not None and run.pending_approval is not None
    fields = {
        "reason": NOTE,
        "reply": reply,
        "own_words": own_words,
        "digest": run.pending_approval["digest"],
    }
    form = client.get(run_url(run_id, verb))
    assert form.status_code == 200
    assert "Told to the customer" in form.content.decode()
    preview = client.post(run_url(run_id, verb), fields)
    assert preview.status_code == 200
    assert RunWait.objects.get(run_id=run_id).resolved_at is None  # a preview decides nothing
    done = client.post(run_url(run_id, verb), {**fields, "confirmed": "yes"})
    assert done.status_code == 302, done.content.decode()[:2000]
    return preview.content.decode()


def nothing_internal(texts: dict[str, str]) -> None:
    for where, text in texts.items():
        for secret in INTERNAL:
            assert secret not in text, (secret, where)


# --- what the customer is told --------------------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
def test_waiver_rejected_with_an_internal_note__the_customer_reads_the_policys_sentence_only(
    engine: str, start_worker: StartWorker, clean_sandbox: SandboxProcess, settings: Any
) -> None:
    settings.REFUNDS_ENGINE = engine
    worker = start_worker()
    run_id = submit(f"PRV{engine[0].upper()}01", waiver_reason="medical", waiver_details=DETAILS)
    waiting_for_approval(run_id, worker)
    chosen = policy.WAIVER_REPLIES["reject"][2]
    operator = as_role("approver_and_view", OPERATOR)

    preview = decide_in_the_admin(operator, run_id, "reject", reply=chosen)
    run = finished(run_id, worker, timeout=120)

    assert html.escape(chosen) in preview and "this is what the customer reads" in preview
    assert run.status == durable.RunStatus.COMPLETED, run.error
    wait = RunWait.objects.get(run_id=run_id)
    assert (wait.actor, wait.reason, wait.outcome["reply"]) == (OPERATOR, NOTE, chosen)
    ledger = partner_effects(clean_sandbox, run_id)
    [email] = ledger["emails"]
    texts = {**customer_pages(run_id), "e-mail": email["subject"] + "\n" + email["body"]}
    nothing_internal(texts)
    assert chosen in email["body"]
    customer = json.loads(texts["status.json"])["customer"]
    assert chosen in customer["details"]
    assert html.escape(chosen) in texts["status page"]
    for line in (customer["headline"], customer["message"], *customer["details"]):
        assert wording.is_customer_text(line), line


@pytest.mark.parametrize("engine", ENGINES)
def test_waiver_decided_in_the_operators_own_words__previewed_then_told_as_written(
    engine: str, start_worker: StartWorker, clean_sandbox: SandboxProcess, settings: Any
) -> None:
    settings.REFUNDS_ENGINE = engine
    worker = start_worker()
    run_id = submit(f"PRO{engine[0].upper()}01", waiver_reason="medical", waiver_details=DETAILS)
    waiting_for_approval(run_id, worker)
    words = "Fee waiver: approved. Get well soon, and safe travels when you are able."

    preview = decide_in_the_admin(
        as_role("approver_and_view", OPERATOR),
        run_id,
        "approve",
        reply="__own_words__",
        own_words=words,
    )
    run = finished(run_id, worker, timeout=120)

    assert html.escape(words) in preview
    assert run.status == durable.RunStatus.COMPLETED, run.error
    ledger = partner_effects(clean_sandbox, run_id)
    assert ledger["authorizations"] == [] and ledger["payments"] == []  # waived: nothing held
    [email] = ledger["emails"]
    texts = {**customer_pages(run_id), "e-mail": email["body"]}
    nothing_internal(texts)
    assert words in email["body"]
    customer = json.loads(texts["status.json"])["customer"]
    assert words in customer["details"]
    for line in (customer["headline"], customer["message"], *customer["details"]):
        assert wording.is_customer_text(line, also=(words,)), line


def test_status_json__documented_shape_with_customer_and_no_internal_text(
    start_worker: StartWorker, settings: Any
) -> None:
    settings.REFUNDS_ENGINE = "graph"
    worker = start_worker()
    run_id = submit("PRSJ01", waiver_reason="bereavement", waiver_details=DETAILS)
    waiting_for_approval(run_id, worker)
    durable.reject(run_id, actor=OPERATOR, reason=NOTE)
    finished(run_id, worker, timeout=120)

    data = json.loads(customer_pages(run_id)["status.json"])

    assert {"id", "status", "workflow_id", "waiting_for", "steps", "customer"} <= set(data)
    assert set(data["steps"][0]) == {"seq", "name", "status", "attempts"}
    customer = data["customer"]
    assert {"headline", "message", "details", "steps"} <= set(customer)
    said = [customer["headline"], customer["message"], *customer["details"]]
    said += [s[key] for s in customer["steps"] for key in ("label", "state_label")]
    for line in said:
        assert wording.is_customer_text(line), line
    assert policy.WAIVER_REPLIES["reject"][0] in customer["details"]  # no reply chosen: default
    dumped = json.dumps(data)
    for secret in (*INTERNAL, MARK):
        assert secret not in dumped, secret


# --- who reads the customer's details in the admin --------------------------------------------
def admin_pages(run_id: str) -> dict[str, str]:
    refund = refund_of(run_id)
    return {
        "list": LIST_URL,
        "change": run_url(run_id),
        "history": run_url(run_id, "history"),
        **{
            verb: run_url(run_id, verb)
            for verb in ("approve", "reject", "retry", "resume", "cancel")
        },
        "refund": f"/admin/refunds/refundrequest/{refund.pk}/change/",
    }


def expected(role: str, page: str, *, waiting: bool) -> tuple[int, bool | None]:
    """(status, whether the details show: None when the page shows no call at all)."""
    views = role != "approver_only"
    if page in ("list", "history"):
        return (200, None) if views else (403, None)
    if page == "change":
        return (200, role in READ_RUN) if views else (403, None)
    if page in ("approve", "reject"):
        if "approve" not in role:
            return 403, None
        return (200, role in READ_APPROVE) if waiting else (302, None)
    if page in ("retry", "resume", "cancel"):
        return 403, None  # operating needs the change permission, which no role here has
    assert page == "refund"
    return (200, True) if role == "domain_viewer" else (403, None)


@pytest.mark.parametrize("engine", ENGINES)
def test_every_admin_page_of_a_waiting_and_a_decided_run__details_only_for_those_who_decide(
    engine: str, start_worker: StartWorker, settings: Any
) -> None:
    settings.REFUNDS_ENGINE = engine
    worker = start_worker()
    e = engine[0].upper()
    waiting_id = submit(f"PRW{e}01", waiver_reason="medical", waiver_details=DETAILS)
    decided_id = submit(f"PRD{e}01", waiver_reason="medical", waiver_details=DETAILS)
    waiting_for_approval(waiting_id, worker)
    waiting_for_approval(decided_id, worker)
    decide_in_the_admin(
        as_role("approver_and_view", OPERATOR),
        decided_id,
        "reject",
        reply=policy.WAIVER_REPLIES["reject"][1],
    )
    finished(decided_id, worker, timeout=120)
    clients = {role: as_role(role) for role in ROLES}
    hidden = redacted(DETAILS)

    seen = []
    for run_id, waiting in ((waiting_id, True), (decided_id, False)):
        for page, url in admin_pages(run_id).items():
            for role, client in clients.items():
                response = client.get(url)
                text = html.unescape(response.content.decode())
                status, shows = expected(role, page, waiting=waiting)
                where = (role, page, "waiting" if waiting else "decided")
                assert response.status_code == status, where
                seen.append(where)
                if response.status_code != 200:
                    continue
                assert (MARK in text) == bool(shows), where
                if shows is False:
                    assert hidden in text, where  # the call is shown, its details redacted
    assert len(seen) == 2 * len(admin_pages(waiting_id)) * len(ROLES)
    # The decided run's pages show the decision, its internal reason and the customer's words.
    page = as_role("approver_and_view", "auditor").get(run_url(decided_id)).content.decode()
    assert f"rejected</strong> by {OPERATOR}" in page and html.escape(NOTE) in page
    assert "told the customer" in page
    # Logs and metrics never carried the details, whoever asked for what.
    assert MARK not in worker.log_path.read_text(errors="replace")
    settings.AGENTFLOW_METRICS_PUBLIC = True
    scraped = Client().get("/metrics")
    assert scraped.status_code == 200 and MARK not in scraped.content.decode()
