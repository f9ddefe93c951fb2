"""Nothing a role may not read reaches it by another door (issue 37): a refund whose customer
told us why their fee should be waived, waiting for approval and decided, both engines, played
in this process against the partner sandbox; every door the admin has onto it, opened as every
role the console knows.

The customer's words are read by those who decide waivers (approve + view runs), by readers of
refund requests (view runs + `refunds.view_refundrequest`) and by superusers. The refund's
status-page id is the key to the customer's own page, which shows those words with no login, so
it is read by the same people: everyone else finds neither the words nor the key — not on the
run page (its fields, steps, events, waits, timeline hovers, conversation), not in its
history, the list, the confirmation pages, the messages an action leaves, not behind any link
those pages hold, and not on /metrics — and no link to the customer's page. The customer's own
page keeps showing them their words.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client

from agentflow import durable
from agentflow._core.sensitive import redacted
from agentflow.models import WorkflowRun
from agentflow.testing import run_to_end
from refunds import policy
from refunds.models import RefundRequest
from tests.support.admin import CONSOLE_ROLES, LIST_URL, as_role, detail_url, first_status, holds
from tests.support.refunds import partner_effects, submit
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

DETAILS = "I was admitted to St Olav ward 7C with pneumonia-q4 on Sunday; I cannot fly."
MARK = "pneumonia-q4"
#: Each role the console defines (docs/console.md, "Who sees what"), and this domain's reader.
ROLES = {**CONSOLE_ROLES, "reader": ("agentflow.view_workflowrun", "refunds.view_refundrequest")}
#: Who reads the customer's words and the key to their page.
READERS = {"superuser", "approver", "reader"}


@dataclass(frozen=True, kw_only=True)
class Refund:
    run_id: str
    public_id: str
    waiting: bool


@dataclass(frozen=True, kw_only=True)
class Opened:
    door: str
    status: int
    text: str


def may(role: str, *permissions: str) -> bool:
    return holds(role, ROLES, *permissions)


def refund_waiting(reference: str) -> Refund:
    run_id = submit(reference, waiver_reason="medical", waiver_details=DETAILS)
    found = run_to_end(run_id, retries=False, max_deliveries=80)
    assert found.waiting_for == "approval", (found.status, found.error)
    public_id = RefundRequest.objects.get(workflow_id=run_id).public_id
    return Refund(run_id=run_id, public_id=public_id, waiting=True)


def refund_decided(reference: str) -> Refund:
    waiting = refund_waiting(reference)
    told = policy.WAIVER_REPLIES["reject"][1]
    durable.reject(waiting.run_id, actor="ops", reason="no documents on file", reply=told)
    done = run_to_end(waiting.run_id, max_deliveries=80)
    assert done.status == durable.RunStatus.COMPLETED, done.error
    return Refund(run_id=waiting.run_id, public_id=waiting.public_id, waiting=False)


# --- the doors ------------------------------------------------------------------------------------
def _get(client: Client, door: str, url: str) -> Opened:
    """GET `url`, following redirects (a refusal's message is read on the page it lands on)."""
    response = client.get(url, follow=True)
    return Opened(door=door, status=first_status(response), text=_text(response))


def _post(client: Client, door: str, url: str, data: dict[str, Any]) -> Opened:
    response = client.post(url, data, follow=True)
    return Opened(door=door, status=first_status(response), text=_text(response))


def _text(response: Any) -> str:
    return html.unescape(response.content.decode())


def _digest(run_id: str) -> str:
    found = durable.snapshot(run_id)
    pending = found.pending_approval if found is not None else None
    return str(pending["digest"]) if pending else ""


Door = Callable[[Client, Refund], list[Opened]]


def run_pages(client: Client, refund: Refund) -> list[Opened]:
    run = _run(refund)
    return [
        _get(client, "run page", detail_url(run)),
        _get(client, "run history", detail_url(run, "history")),
        _get(client, "run list", LIST_URL),
        _get(client, "run list searched by the run id", f"{LIST_URL}?q={refund.run_id}"),
        _get(client, "runs waiting for approval", f"{LIST_URL}?wake=approval"),
    ]


def decision_pages(client: Client, refund: Refund) -> list[Opened]:
    run = _run(refund)
    opened = [_get(client, f"{verb} page", detail_url(run, verb)) for verb in ("approve", "reject")]
    if refund.waiting:
        fields = {
            "reason": "checking",
            "reply": policy.WAIVER_REPLIES["reject"][0],
            "digest": _digest(refund.run_id),
        }
        opened.append(_post(client, "reject preview", detail_url(run, "reject"), fields))
    return opened


def operator_pages(client: Client, refund: Refund) -> list[Opened]:
    run = _run(refund)
    opened = [
        _get(client, f"{verb} page", detail_url(run, verb))
        for verb in ("retry", "resume", "cancel", "move")
    ]
    opened.append(_get(client, "fork page", detail_url(run, "fork") + "?position=1"))
    # A refusal's message, on the page the operator lands on.
    opened.append(_post(client, "retry refused", detail_url(run, "retry"), {"reason": "try"}))
    opened.append(
        _post(
            client,
            "cancel from the list",
            LIST_URL,
            {"action": "cancel_runs", "_selected_action": [refund.run_id]},
        )
    )
    return opened


def domain_pages(client: Client, refund: Refund) -> list[Opened]:
    pk = RefundRequest.objects.get(public_id=refund.public_id).pk
    return [
        _get(client, "refund request", f"/admin/refunds/refundrequest/{pk}/change/"),
        _get(client, "refund requests", "/admin/refunds/refundrequest/"),
    ]


def other_pages(client: Client, refund: Refund) -> list[Opened]:
    return [
        _get(client, "admin index", "/admin/"),
        _get(client, "partners", "/admin/agentflow/partnerstate/"),
        _get(client, "metrics", "/metrics"),
    ]


def linked_pages(client: Client, refund: Refund) -> list[Opened]:
    """Every same-site link the role's run page holds, followed as that role."""
    page = client.get(detail_url(_run(refund)))
    if page.status_code != 200:
        return []
    hrefs = _hrefs(page.content.decode())
    assert hrefs, "the run page links nothing"
    followed = [h for h in hrefs if h.startswith("/") and not h.startswith("/admin/logout")]
    return [_get(client, f"link {href}", href) for href in followed]


DOORS: dict[str, Door] = {
    "run pages": run_pages,
    "decision pages": decision_pages,
    "operator pages": operator_pages,
    "domain pages": domain_pages,
    "other pages": other_pages,
    "linked pages": linked_pages,
}


def expected_status(role: str, door: str, refund: Refund) -> set[int]:
    """What the door answers this role first (a redirect is followed for the text)."""
    views = may(role, "agentflow.view_workflowrun", "agentflow.change_workflowrun")
    if door.startswith("link "):
        return {200, 302, 403}  # a link to a page of another permission answers 403
    if door.startswith("run "):
        return {200} if views else {403}
    if door == "runs waiting for approval":
        return {200} if views else {403}
    if door in ("approve page", "reject page", "reject preview"):
        if not may(role, "agentflow.approve_workflowrun"):
            return {403}
        return {200} if refund.waiting else {302}  # "waits for no approval now"
    if door in ("retry page", "resume page", "cancel page", "move page"):
        return {200} if may(role, "agentflow.change_workflowrun") else {403}
    if door in ("fork page", "retry refused"):
        return {302} if may(role, "agentflow.change_workflowrun") else {403}
    if door == "cancel from the list":
        # Offered to operators (a confirmation page); for the others Django answers that no
        # action was chosen, or 403 without the view permission.
        return {200} if views else {403}
    if door.startswith("refund request"):
        return {200} if may(role, "refunds.view_refundrequest") else {403}
    if door == "partners":
        return (
            {200}
            if may(role, "agentflow.view_partnerstate", "agentflow.pause_partnerstate")
            else {403}
        )
    if door == "admin index":
        return {200}
    assert door == "metrics", door
    return {200}


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href and href not in self.hrefs:
            self.hrefs.append(href)


def _hrefs(page: str) -> list[str]:
    parser = _Links()
    parser.feed(page)
    return parser.hrefs


def _run(refund: Refund) -> WorkflowRun:
    return WorkflowRun.objects.get(pk=refund.run_id)


# --- the tests ------------------------------------------------------------------------------------
@pytest.fixture(params=["graph", "agent"])
def refunds(
    partners: SandboxProcess, settings: Any, request: pytest.FixtureRequest
) -> list[Refund]:
    """A refund of each engine waiting for the waiver's approval, and one decided."""
    settings.REFUNDS_ENGINE = request.param
    settings.AGENTFLOW_METRICS_PUBLIC = True
    e = request.param[0].upper()
    return [refund_waiting(f"DRW{e}01"), refund_decided(f"DRD{e}01")]


@pytest.mark.parametrize("role", ROLES)
def test_every_door__the_customers_words_and_their_pages_key_only_for_readers(
    role: str, refunds: list[Refund], settings: Any
) -> None:
    """One test per engine and role (each plays two refunds); inside, every door, each named
    in the assertion it fails."""
    client = as_role(role, ROLES)
    engine = settings.REFUNDS_ENGINE
    reads = role in READERS
    opened_doors = set()

    for refund in refunds:
        for door in DOORS.values():
            for opened in door(client, refund):
                where = (engine, role, opened.door, "waiting" if refund.waiting else "decided")
                opened_doors.add(opened.door.split(" /")[0])
                assert opened.status in expected_status(role, opened.door, refund), where
                if not reads:
                    assert MARK not in opened.text, where
                    assert refund.public_id not in opened.text, where
                if opened.door == "run page" and opened.status == 200:
                    # The page can fail: readers read the words, everyone else their size.
                    assert (MARK in opened.text) == reads, where
                    assert (redacted(DETAILS) in opened.text) != reads, where
                    assert (f"/refunds/{refund.public_id}/" in opened.text) == reads, where
                    assert (redacted(refund.public_id) in opened.text) != reads, where
    assert len(opened_doors) >= 17, sorted(opened_doors)  # no door skipped unnoticed


def test_the_customers_own_page__still_shows_them_their_words(
    partners: SandboxProcess, settings: Any
) -> None:
    settings.REFUNDS_ENGINE = "graph"
    refund = refund_waiting("DRC001")

    page = _text(Client().get(f"/refunds/{refund.public_id}/"))
    data = Client().get(f"/refunds/{refund.public_id}/status.json").json()

    assert MARK in page  # what they wrote about their waiver, read back to them
    assert MARK not in str(data)  # the JSON carries sentences written for them, not their words


def test_the_emails__carry_neither_the_customers_words_nor_their_pages_key(
    partners: SandboxProcess, settings: Any
) -> None:
    """The e-mails go to the customer alone, yet pass through mail servers and get forwarded:
    they say what became of the waiver in the policy's or the operator's sentence."""
    settings.REFUNDS_ENGINE = "graph"
    refund = refund_decided("DRE001")

    [email] = partner_effects(partners, refund.run_id)["emails"]

    said = email["subject"] + "\n" + email["body"]
    assert policy.WAIVER_REPLIES["reject"][1] in " ".join(said.split())
    assert MARK not in said and refund.public_id not in said
