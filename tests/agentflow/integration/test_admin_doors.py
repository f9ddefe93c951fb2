"""The admin's other doors onto a run's sensitive arguments (issue 37): the domain's links, the
signals a partner sent, the difference a newer build finds, the answer an action gives, the fork
page, the Partners page. Each follows the rule of the run page that holds it: a call's
declared-sensitive arguments are read by those who decide it (approve + view runs), by holders
of the permission the declaration names, and by superusers; everyone else reads "redacted (N
characters)", and a link that carries such a value (a key to what it opens) is not shown them.
One test per door and role; real runs driven in this process, real Postgres."""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client, override_settings

from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow._core import links
from agentflow._limits import limiter, rules
from agentflow.exceptions import PartnerUnavailable
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow.testing import run_to_end
from tests.support import workflows
from tests.support.admin import CONSOLE_ROLES, as_role, detail_url, first_status

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

#: Long enough that a divergence's diff quotes an excerpt of it, cut on both sides.
NOTE = (
    "My father died on Monday in the Zanzibar-ward-7 hospice; the funeral is on Friday and I "
    "must be there with my mother, who cannot travel alone, so please move me to the later "
    "flight and waive the fee."
)
#: Any piece of the note this long, found on a page, is the note shown (whole or cut).
PIECE = 16
ROLES = {**CONSOLE_ROLES, "reader": ("agentflow.view_workflowrun", workflows.CONFIDED_READERS)}
READERS = {"superuser", "approver", "reader"}
VIEWS = {"superuser", "viewer", "operator", "approver", "reader"}


def shows_note(text: str) -> bool:
    return any(NOTE[at : at + PIECE] in text for at in range(len(NOTE) - PIECE + 1))


def digest_of(run_id: str) -> str:
    found = durable.snapshot(run_id)
    assert found is not None and found.pending_approval is not None
    return str(found.pending_approval["digest"])


def confided_waiting() -> WorkflowRun:
    run_id = durable.start(workflows.confided.name, input={"amount": 4500, "note": NOTE})
    assert run_to_end(run_id, retries=False).waiting_for == "approval"
    return WorkflowRun.objects.get(pk=run_id)


def confiding_waiting(**extra: Any) -> WorkflowRun:
    run_id = durable.start(workflows.confiding.name, input={"note": NOTE, **extra})
    assert run_to_end(run_id, retries=False).waiting_for == "approval"
    return WorkflowRun.objects.get(pk=run_id)


# --- the doors: each makes its run and answers (status, the text the role got) -----------------
Door = Callable[[Client, pytest.MonkeyPatch], tuple[int, str]]


def run_link(client: Client, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """A domain link whose address carries the note (as a status page's id would) and one
    whose label quotes it: the first is a key, the second a text."""

    def linked(run: links.RunRef) -> list[links.Link]:
        note = run.input["note"]
        return [
            links.Link(label="The claim's own page", url=f"/claims/?note={note}", title="key"),
            links.Link(label=f"Claim: {note}", url="/admin/", title=note),
        ]

    monkeypatch.setitem(links._run_linkers, workflows.confided.name, linked)
    response = client.get(detail_url(confided_waiting()))
    return response.status_code, response.content.decode()


def step_link(client: Client, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """A step's partner link built from the run's input: the note in its address."""

    def linked(run: links.RunRef, step: links.StepRef) -> list[links.Link]:
        return [
            links.Link(label=f"#{step.seq}", url=f"https://registry.test/?q={run.input['note']}")
        ]

    monkeypatch.setitem(links._step_linkers, workflows.confided.name, linked)
    response = client.get(detail_url(confided_waiting()))
    return response.status_code, response.content.decode()


def signal_payload(client: Client, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """A partner's signal repeating the note, kept on the run (no wait took it)."""
    run = confided_waiting()
    durable.signal(run.pk, "registry_answer", {"echo": NOTE}, signal_id="sig-1")
    response = client.get(detail_url(run))
    return response.status_code, response.content.decode()


def build_difference(client: Client, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """An agent run on an older build whose first model turn this build would ask otherwise:
    the run page's build field quotes the difference, an excerpt of the note on each side."""
    run = _diverged_on_an_older_build()
    response = client.get(detail_url(run))
    return response.status_code, response.content.decode()


def move_refused(client: Client, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """Move to the current build, refused with the difference: the message quotes it."""
    run = _diverged_on_an_older_build()
    response = client.post(detail_url(run, "move"), {"reason": "deploy"}, follow=True)
    return first_status(response), response.content.decode()


def fork_page(client: Client, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """What a fork of a failed agent run would set aside: the call with the note."""
    run = confiding_waiting(fail=True)
    durable.approve(run.pk, actor="ana", reason="ok", digest=digest_of(run.pk))
    assert run_to_end(run.pk).status == RunStatus.FAILED
    response = client.get(detail_url(run, "fork") + "?position=1")
    return response.status_code, response.content.decode()


@override_settings(AGENTFLOW_PARTNER_LIMITS={"claims/registry: eu": {"concurrency": 2}})
def partner_error(client: Client, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """A limited partner's error that repeats the note, made in a step of the run: kept on the
    Partners page, which whoever may see partners reads, masked for everyone."""
    run = confided_waiting()
    with (
        limiter.step_calls(run.pk, run.current_seq),
        pytest.raises(PartnerUnavailable),
        limiter.partner_call("claims/registry: eu", "file"),
    ):
        raise PartnerUnavailable(f"HTTP 503: could not file {NOTE!r}")
    assert rules.limit_for("claims/registry: eu") is not None
    response = client.get("/admin/agentflow/partnerstate/")
    return response.status_code, response.content.decode()


def _diverged_on_an_older_build() -> WorkflowRun:
    run = confiding_waiting()
    turn = StepCheckpoint.objects.get(run=run, seq=1)
    told = json.dumps(turn.arguments).replace(json.dumps(NOTE), json.dumps(f"{NOTE} Thank you."))
    assert "Thank you." in told  # the user's message, as this turn recorded it
    StepCheckpoint.objects.filter(pk=turn.pk).update(arguments=json.loads(told), digest="0" * 64)
    WorkflowRun.objects.filter(pk=run.pk).update(build="an-older-build")
    return WorkflowRun.objects.get(pk=run.pk)


DOORS: dict[str, Door] = {
    "run link": run_link,
    "step link": step_link,
    "signal payload": signal_payload,
    "build difference": build_difference,
    "move refused": move_refused,
    "fork page": fork_page,
    "partner error": partner_error,
}


def expected(role: str, door: str) -> tuple[int, bool | None]:
    """(first status, whether the note shows there: None when the page is refused)."""
    if door == "partner error":
        # Kept masked for everyone: the page is no run's, so no run's readers are known.
        sees = role in ("superuser", "partners_viewer", "partner_operator")
        return (200, False) if sees else (403, None)
    if door in ("move refused", "fork page"):
        if role not in ("superuser", "operator"):
            return 403, None
        return (302 if door == "move refused" else 200), role in READERS
    if role not in VIEWS:
        return 403, None
    return 200, role in READERS


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("door", DOORS)
def test_door__shows_the_note_only_to_those_who_may_read_it(
    door: str, role: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    status, shown = DOORS[door](as_role(role, ROLES), monkeypatch)
    page = html.unescape(shown)

    want_status, shows = expected(role, door)
    assert status == want_status
    if shows is None:
        return
    assert shows_note(page) == shows
    if not shows:
        assert "redacted (" in page  # what was there is said to be hidden, not left out
    if door == "run link":
        assert ("/claims/?note=" in page) == shows  # the key: not shown to non-readers
        assert ("The claim's own page" in page) == shows
        assert "Claim: " in page  # the other link stays, its label masked
    if door == "step link":
        assert ("registry.test" in page) == shows
    if door == "build difference":
        assert "cannot take it: diverged" in page
    if door == "move refused":
        assert "was not moved to the current build: build" in page


def test_build_difference__an_excerpt_of_the_note_is_what_a_reader_reads() -> None:
    """The door above can fail: the difference does quote the note, cut on both sides."""
    page = html.unescape(
        as_role("approver", ROLES).get(detail_url(_diverged_on_an_older_build())).content.decode()
    )

    assert "Thank you." in page and "…" in page
    assert "please move me to the later flight" in page
