"""Names an operator reads with any character a real system uses (issue 37): partner keys (a
model's `openai/gpt-4o-mini`), build ids, workflow, step and signal names with "/", ":", ".",
spaces and non-ASCII letters work in every admin page, URL and action, for every role; in the
metrics' labels, exactly as named; and in the commands. Real Postgres, runs played in this
process.

A role without the permission a page needs is answered 403 (never a 500); every page and action
it may open answers 2xx, or a redirect to one."""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from io import StringIO
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.core.management import call_command
from django.test import Client
from django.utils.http import urlencode
from django.utils.text import capfirst
from prometheus_client.parser import text_string_to_metric_families

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow._core import builds
from agentflow._limits import rules
from agentflow._limits import store as limits_store
from agentflow.models import PartnerEvent, PartnerState, WorkflowRun
from agentflow.testing import run_to_end
from tests.support import workflows
from tests.support.admin import CONSOLE_ROLES, LIST_URL, as_role, detail_url, first_status, holds

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

PARTNERS_URL = "/admin/agentflow/partnerstate/"
#: Partner keys as real systems name them: a model, a region, a space, other scripts.
KEYS = (workflows.ODD_PARTNER, "crm:eu-west.1", "legacy airline", "zahlungsdienst/ü:naïve 東京")
LIMITS = {
    workflows.ODD_PARTNER: {"rate": "600/m"},
    "crm:eu-west.1": {"concurrency": 2},
    "legacy airline": {"rate": "5/s"},
    "zahlungsdienst/ü:naïve 東京": {"rate": "1/s", "concurrency": 1},
}
#: The build this process runs, and an older one a run stays pinned to.
BUILD = "release/2026.12:rc 1 ü"
OLD_BUILD = "registry.test/app:2026.11 rc2 東京"
ROLES = CONSOLE_ROLES


def may(role: str, *codenames: str) -> bool:
    return holds(role, ROLES, *(f"agentflow.{codename}" for codename in codenames))


class _Forms(HTMLParser):
    """The Pause / Resume forms' addresses, as a browser reads them off the page."""

    def __init__(self) -> None:
        super().__init__()
        self.actions: dict[str, list[str]] = {}
        self._partner = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "tr" and found.get("data-partner"):
            self._partner = str(found["data-partner"])
        for name in ("action", "formaction"):
            if tag in ("form", "button") and found.get(name) and self._partner:
                self.actions.setdefault(self._partner, []).append(str(found[name]))


def pause_forms(page: str) -> dict[str, list[str]]:
    parser = _Forms()
    parser.feed(page)
    return parser.actions


@pytest.fixture
def odd_partners(settings: Any) -> Iterator[None]:
    """Every odd key limited, each with a state row, a call recorded and an error."""
    settings.AGENTFLOW_PARTNER_LIMITS = LIMITS
    for key in KEYS:
        limit = rules.limit_for(key)
        assert limit is not None, key
        turn = limits_store.turn_take(limit)
        assert isinstance(turn, limits_store.Turn)
        limits_store.turn_return(
            limit, turn, outcome=limits_store.UNAVAILABLE, detail=f"{key}: 503"
        )
    yield


# --- partner keys -------------------------------------------------------------------------------
@pytest.mark.usefixtures("odd_partners")
@pytest.mark.parametrize("role", ROLES)
def test_partners__every_page_and_action_for_each_odd_key_and_role(role: str) -> None:
    client = as_role(role)
    sees = may(role, "view_partnerstate", "pause_partnerstate")
    pauses = may(role, "pause_partnerstate")

    page = client.get(PARTNERS_URL)

    assert page.status_code == (200 if sees else 403)
    if not sees:
        for key in KEYS:
            url = f"{PARTNERS_URL}{quote(key)}/pause/"
            assert client.post(url, {"reason": "x"}).status_code == 403, key
        assert not PartnerState.objects.filter(paused=True).exists()
        return
    text = page.content.decode()
    forms = pause_forms(text)
    for key in KEYS:
        assert f'data-partner="{key}"' in text, key
        for url in (f"{PARTNERS_URL}{quote(key)}/change/", f"{PARTNERS_URL}{quote(key)}/history/"):
            shown = client.get(url, follow=True)
            assert first_status(shown) == 200 and shown.status_code == 200, (key, url)
            assert key in shown.content.decode(), (key, url)
    if not pauses:
        assert forms == {}  # viewing is not pausing
        return
    assert set(forms) == set(KEYS)
    for key in KEYS:
        [pause] = forms[key]  # no breaker open yet for a key that erred once: Pause is offered
        done = client.post(pause, {"reason": f"their maintenance of {key}"}, follow=True)
        assert first_status(done) == 302 and done.status_code == 200, key
        assert capfirst(f"{key}: paused.") in html.unescape(done.content.decode()), key
        assert PartnerState.objects.get(partner=key).paused, key
        [_, resume] = pause_forms(done.content.decode())[key]  # Pause's form, Resume's button
        back = client.post(resume, {"reason": "back"}, follow=True)
        assert first_status(back) == 302 and back.status_code == 200, key
        assert not PartnerState.objects.get(partner=key).paused, key
    paused = PartnerEvent.objects.filter(kind="paused").values_list("partner", "actor")
    assert sorted(paused) == sorted((key, role) for key in KEYS)


def test_partners__an_unknown_or_forged_key_is_said_so_not_a_500(settings: Any) -> None:
    settings.AGENTFLOW_PARTNER_LIMITS = LIMITS
    client = as_role("superuser")

    for forged in ("nobody_2Fhere", "a%00b", "_ZZ", quote("openai/gpt-5")):
        done = client.post(f"{PARTNERS_URL}{forged}/pause/", {"reason": "x"}, follow=True)
        assert (
            first_status(done) == 302
            and "is not in AGENTFLOW_PARTNER_LIMITS" in done.content.decode()
        )


@pytest.mark.usefixtures("odd_partners")
def test_metrics__each_odd_key_is_its_own_label_value_exactly(settings: Any) -> None:
    settings.AGENTFLOW_METRICS_PUBLIC = True

    scraped = Client().get("/metrics").content.decode()

    labelled = {
        sample.labels["partner"]
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
        if family.name == "agentflow_partner_breaker_state"
    }
    assert labelled == set(KEYS)


# --- a workflow, its steps, its signal and its builds -------------------------------------------
@pytest.fixture
def odd_runs(settings: Any, odd_partners: None) -> dict[str, str]:
    """A run of the odd-named workflow started and signalled by the commands and finished; one
    waiting for its signal; one pinned to an older build, held for a worker of it."""
    settings.AGENTFLOW_BUILD_ID = BUILD
    out = StringIO()
    call_command("start_workflow", workflows.odd_names.name, "--input", "{}", stdout=out)
    done = out.getvalue().strip()
    assert run_to_end(done).waiting_for == "signal"
    out = StringIO()
    call_command(
        "agentflow_signal", done, workflows.ODD_SIGNAL, "--payload", '{"ok": 1}', stdout=out
    )
    assert f"delivered signal {workflows.ODD_SIGNAL!r}" in out.getvalue()
    assert run_to_end(done).status == RunStatus.COMPLETED
    waiting = durable.start(workflows.odd_names.name)
    assert run_to_end(waiting).waiting_for == "signal"
    pinned = durable.start(workflows.odd_names.name)
    store.build_record(OLD_BUILD, builds.definitions_summary())
    WorkflowRun.objects.filter(pk=pinned).update(
        build=OLD_BUILD,
        started_build=OLD_BUILD,
        pinned=True,
        hold=f"build:{OLD_BUILD}",
        status=RunStatus.WAITING,
    )
    return {"done": done, "waiting": waiting, "pinned": pinned}


Page = Callable[[str], str]


def _page(name: str = "change") -> Page:
    return lambda run: detail_url(WorkflowRun.objects.get(pk=run), name)


def _listed(**params: str) -> Page:
    return lambda run: f"{LIST_URL}?{urlencode(params)}"


def _searched(run: str) -> str:
    return f"{LIST_URL}?{urlencode({'q': run})}"


#: Each page of a run, and what it needs: seeing runs, or operating them.
PAGES: dict[str, tuple[Page, str]] = {
    "run list": (lambda run: LIST_URL, "view"),
    "runs of the workflow": (_listed(workflow=workflows.odd_names.name), "view"),
    "runs searched by id": (_searched, "view"),
    "run page": (_page(), "view"),
    "run history": (_page("history"), "view"),
    **{f"{verb} page": (_page(verb), "operate") for verb in ("retry", "resume", "cancel", "move")},
}


@pytest.mark.parametrize("role", ROLES)
def test_runs__every_page_and_action_with_odd_workflow_step_signal_and_build_names(
    role: str, odd_runs: dict[str, str]
) -> None:
    client = as_role(role)
    views = may(role, "view_workflowrun", "change_workflowrun")
    operates = may(role, "change_workflowrun")
    if views:
        dashboard = html.unescape(client.get(LIST_URL).content.decode())
        assert OLD_BUILD[:15] in dashboard  # the builds card, each id cut to fit

    for which, run in odd_runs.items():
        for name, (url_of, needs) in PAGES.items():
            allowed = views if needs == "view" else operates
            response = client.get(url_of(run), follow=True)
            where = (role, which, name)
            assert first_status(response) in ((200, 302) if allowed else (403,)), where
            if not allowed:
                continue
            assert response.status_code == 200, where
            text = response.content.decode()
            if name == "run page":
                assert "billing/eu:refunds ü v1" in text, where
                if which == "pinned":
                    assert f"waiting for a worker of build {OLD_BUILD}" in text, where
        if operates:  # the actions themselves: each answered, none a 500
            for verb in ("resume", "move", "cancel"):
                acted = client.post(
                    detail_url(WorkflowRun.objects.get(pk=run), verb), {"reason": "x"}, follow=True
                )
                assert first_status(acted) == 302 and acted.status_code == 200, (role, which, verb)


def test_runs__metrics_and_commands_carry_the_names_exactly(
    odd_runs: dict[str, str], settings: Any
) -> None:
    settings.AGENTFLOW_METRICS_PUBLIC = True
    scraped = Client().get("/metrics").content.decode()
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(scraped):
        for sample in family.samples:
            for label, value in sample.labels.items():
                labels.setdefault(f"{family.name}:{label}", set()).add(value)
    listed = StringIO()
    call_command("agentflow_builds", stdout=listed)
    as_json = StringIO()
    call_command("agentflow_builds", "--json", stdout=as_json)

    assert workflows.odd_names.name in labels["agentflow_runs_active:workflow"]
    assert {BUILD, OLD_BUILD} <= labels["agentflow_runs_by_build:build"]
    assert OLD_BUILD in listed.getvalue() and BUILD in listed.getvalue()
    shown = json.loads(as_json.getvalue())
    assert shown["build"] == BUILD
    assert {b["build"] for b in shown["builds"]} >= {BUILD, OLD_BUILD}
