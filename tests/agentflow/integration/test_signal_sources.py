"""Signals from a shell (`manage.py agentflow_signal`) and from a partner's signed webhook
(`agentflow.webhooks`), in this process against real Postgres: each delivers once per id, and
bad input is refused with the reason, delivering nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
import time_machine
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command
from django.test import Client

from agentflow import durable, webhooks
from agentflow._base.states import RunStatus
from agentflow.models import RunSignal, WebhookReceipt
from agentflow.testing import run_to_end
from agentflow.testing.processes import current_database_url
from tests.support import workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

SECRET = "whsec_airline_test"
URL = "/hooks/airline/"


def waiting_run() -> str:
    run_id = durable.start(workflows.signalled.name)
    found = run_to_end(run_id, retries=False)
    assert found.waiting_for == "signal"
    return run_id


def signals_of(run_id: str) -> list[tuple[str, Any]]:
    return [(s.signal_id, s.payload) for s in RunSignal.objects.filter(run_id=run_id)]


# --- from a shell -------------------------------------------------------------------------------
def signal_command(*args: str) -> str:
    out = StringIO()
    call_command("agentflow_signal", *args, stdout=out)
    return out.getvalue()


def test_agentflow_signal__delivers__the_same_signal_id_again_does_nothing() -> None:
    run_id = waiting_run()

    said = signal_command(run_id, "reply", "--payload", '{"text": "yes"}', "--signal-id", "op-1")
    again = signal_command(run_id, "reply", "--payload", '{"text": "no"}', "--signal-id", "op-1")
    done = run_to_end(run_id)

    assert said.strip() == f"delivered signal 'reply' to {run_id} (signal id op-1)"
    assert (
        again.strip()
        == f"duplicate: signal id op-1 was sent to {run_id} before; nothing done again"
    )
    assert done.status == RunStatus.COMPLETED, done.error
    assert done.steps[1].output == {"payload": {"text": "yes"}}
    assert signals_of(run_id) == [("op-1", {"text": "yes"})]


def test_agentflow_signal__without_a_signal_id__a_new_one_each_time_printed() -> None:
    run_id = durable.start(workflows.two_replies.name)
    said = [signal_command(run_id, "reply"), signal_command(run_id, "reply")]

    ids = [s.signal_id for s in RunSignal.objects.filter(run_id=run_id)]
    assert len(set(ids)) == 2 and all(i.startswith("shell-") for i in ids)
    assert [f"(signal id {i})" in line for i, line in zip(ids, said, strict=True)] == [True] * 2


def test_agentflow_signal__refused__the_reason_as_a_command_error() -> None:
    run_id = waiting_run()
    signal_command(run_id, "reply", "--signal-id", "a")
    run_to_end(run_id)

    with pytest.raises(CommandError, match=r"signal 'reply' refused: the run is finished"):
        signal_command(run_id, "reply", "--signal-id", "b")
    with pytest.raises(CommandError, match="a signal needs a name"):
        signal_command(run_id, "", "--signal-id", "c")
    with pytest.raises(CommandError, match="--payload is not JSON"):
        signal_command(run_id, "reply", "--payload", "{nope")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["reply", "--payload", "{nope"], "--payload is not JSON"),
        (["reply", "--signal-id", "x" * 201], "a signal needs a signal_id (1-200 characters,"),
    ],
    ids=["bad-json", "long-id"],
)
def test_agentflow_signal__from_a_shell__bad_input_says_so_without_a_traceback(
    args: list[str], says: str
) -> None:
    run_id = waiting_run()
    done = subprocess.run(
        [sys.executable, "manage.py", "agentflow_signal", run_id, *args],
        cwd=django_settings.BASE_DIR,
        env={**os.environ, "DATABASE_URL": current_database_url()},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert signals_of(run_id) == []


# --- from a partner's signed webhook ------------------------------------------------------------
@pytest.fixture
def partner_hooks(settings: Any) -> Iterator[Client]:
    """This site with the webhook view mounted and the airline's secret set (the old one is
    still accepted while it rotates)."""
    settings.ROOT_URLCONF = "tests.support.webhook_urls"
    settings.AGENTFLOW_WEBHOOK_SECRETS = {"airline": [SECRET, "whsec_airline_old"], "crm": "c"}
    yield Client()


def body_for(run_id: str, event_id: str = "evt_1", **extra: Any) -> bytes:
    return json.dumps({"id": event_id, "run_id": run_id, "signal": "reply", **extra}).encode()


def post(client: Client, body: bytes, header: str | None, url: str = URL) -> Any:
    headers = {webhooks.SIGNATURE_HEADER: header} if header is not None else {}
    return client.post(url, data=body, content_type="application/json", headers=headers)


def now() -> int:
    return int(time.time())


def test_webhook__correctly_signed__delivered_once_under_the_partners_namespace(
    partner_hooks: Client,
) -> None:
    run_id = waiting_run()
    body = body_for(run_id, payload={"rebooked": "LH123"})

    answered = post(partner_hooks, body, webhooks.sign(SECRET, body, timestamp=now()))
    done = run_to_end(run_id)

    assert answered.status_code == 200, answered.content
    assert answered.json() == {"result": "delivered", "signal_id": "evt_1"}
    assert done.status == RunStatus.COMPLETED, done.error
    assert done.steps[1].output == {"payload": {"rebooked": "LH123"}}
    assert signals_of(run_id) == [("airline:evt_1", {"rebooked": "LH123"})]


def test_webhook__signed_with_the_old_secret_while_rotating__accepted(
    partner_hooks: Client,
) -> None:
    run_id = waiting_run()
    body = body_for(run_id)
    stamp = now()
    old = webhooks.sign("whsec_airline_old", body, timestamp=stamp).split("v1=")[1]
    header = f"t={stamp},v1={'0' * 64},v1={old}"  # one signature per secret it may hold

    assert post(partner_hooks, body, header).status_code == 200


@pytest.mark.parametrize(
    "forge",
    ["wrong_secret", "other_body", "other_partner", "no_header", "no_v1", "garbled"],
)
def test_webhook__a_bad_signature__400_and_nothing_delivered(
    partner_hooks: Client, forge: str
) -> None:
    run_id = waiting_run()
    body = body_for(run_id)
    stamp = now()
    header: str | None = {
        "wrong_secret": webhooks.sign("whsec_guess", body, timestamp=stamp),
        "other_body": webhooks.sign(SECRET, body_for(run_id, payload=1), timestamp=stamp),
        "other_partner": webhooks.sign("c", body, timestamp=stamp),
        "no_header": None,
        "no_v1": f"t={stamp}",
        "garbled": "v1=abc,t=yesterday",
    }[forge]

    answered = post(partner_hooks, body, header)

    assert answered.status_code == 400, answered.content
    assert "signature" in answered.json()["error"].lower()
    assert signals_of(run_id) == []
    assert not WebhookReceipt.objects.exists()
    assert durable.snapshot(run_id).waiting_for == "signal"  # type: ignore[union-attr]


@pytest.mark.parametrize("seconds", [-301, 301], ids=["stale", "from_the_future"])
def test_webhook__a_timestamp_outside_the_tolerance__400_and_nothing_delivered(
    partner_hooks: Client, seconds: int
) -> None:
    run_id = waiting_run()
    body = body_for(run_id)
    moment = datetime(2031, 5, 4, 12, 0, tzinfo=UTC)  # the clock the view reads, frozen
    with time_machine.travel(moment, tick=False):
        stamp = int(moment.timestamp()) + seconds
        answered = post(partner_hooks, body, webhooks.sign(SECRET, body, timestamp=stamp))
        at_the_edge = int(moment.timestamp()) + (300 if seconds > 0 else -300)
        edge = post(partner_hooks, body, webhooks.sign(SECRET, body, timestamp=at_the_edge))

    assert answered.status_code == 400, answered.content
    assert answered.json()["error"] == "the timestamp is more than 300 s from now"
    assert edge.status_code == 200, edge.content  # 300 s is inside
    assert signals_of(run_id) == [("airline:evt_1", None)]  # the edge's, once


def test_webhook__the_same_signed_request_again__400_a_replay__delivered_once(
    partner_hooks: Client,
) -> None:
    run_id = waiting_run()
    body = body_for(run_id)
    header = webhooks.sign(SECRET, body, timestamp=now())

    first = post(partner_hooks, body, header)
    replayed = post(partner_hooks, body, header)

    assert first.status_code == 200 and first.json()["result"] == "delivered"
    assert replayed.status_code == 400
    assert replayed.json()["error"] == "this signed request was received before (a replay)"
    assert len(signals_of(run_id)) == 1
    assert WebhookReceipt.objects.count() == 1


def test_webhook__the_partners_own_repeated_delivery__signed_afresh__acts_once(
    partner_hooks: Client,
) -> None:
    run_id = waiting_run()
    body = body_for(run_id, payload={"n": 1})
    stamp = now()

    first = post(partner_hooks, body, webhooks.sign(SECRET, body, timestamp=stamp - 1))
    again = post(partner_hooks, body, webhooks.sign(SECRET, body, timestamp=stamp))

    assert (first.status_code, first.json()["result"]) == (200, "delivered")
    assert (again.status_code, again.json()["result"]) == (200, "duplicate")
    assert signals_of(run_id) == [("airline:evt_1", {"n": 1})]
    assert run_to_end(run_id).steps[1].output == {"payload": {"n": 1}}


def test_webhook__a_run_that_refuses__409_with_the_reason__no_receipt_kept(
    partner_hooks: Client,
) -> None:
    run_id = waiting_run()
    durable.signal(run_id, "reply", signal_id="first")
    run_to_end(run_id)
    body = body_for(run_id, "evt_2")
    header = webhooks.sign(SECRET, body, timestamp=now())

    answered = [post(partner_hooks, body, header) for _ in range(2)]
    unknown = body_for("wf_nope")

    assert [a.status_code for a in answered] == [409, 409]  # refused again, not a "replay"
    assert answered[0].json() == {"error": "the run is finished (completed)"}
    assert not WebhookReceipt.objects.exists()
    missing = post(partner_hooks, unknown, webhooks.sign(SECRET, unknown, timestamp=now()))
    assert (missing.status_code, missing.json()) == (409, {"error": "no such run"})


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"not json", "the body is not JSON"),
        (b"[1, 2]", "the body is not a JSON object"),
        (b'{"id": "e", "signal": "reply"}', "the body has no 'run_id'"),
        (b'{"id": "", "run_id": "wf_x", "signal": "reply"}', "the body has no 'id'"),
        (b'{"id": "e", "run_id": "wf_x", "signal": 7}', "the body has no 'signal'"),
    ],
)
def test_webhook__a_signed_body_that_names_no_signal__400(
    partner_hooks: Client, body: bytes, says: str
) -> None:
    answered = post(partner_hooks, body, webhooks.sign(SECRET, body, timestamp=now()))

    assert answered.status_code == 400
    assert answered.json()["error"].startswith(says)
    assert not WebhookReceipt.objects.exists()


def test_webhook__no_secret_for_the_partner_404__and_only_post(partner_hooks: Client) -> None:
    body = body_for("wf_x")
    stranger = post(partner_hooks, body, webhooks.sign(SECRET, body, timestamp=now()), "/hooks/x/")

    assert stranger.status_code == 404
    assert partner_hooks.get(URL).status_code == 405


def test_webhook__receipts_older_than_the_tolerance__pruned_by_later_requests(
    partner_hooks: Client,
) -> None:
    run_id = durable.start(workflows.two_replies.name)
    moment = datetime(2031, 5, 4, 12, 0, tzinfo=UTC)
    for offset, event in ((0, "evt_1"), (361, "evt_2")):  # past 300 s and the 60 s margin
        later = moment + timedelta(seconds=offset)
        body = body_for(run_id, event)
        with time_machine.travel(later, tick=False):
            stamp = int(later.timestamp())
            answered = post(partner_hooks, body, webhooks.sign(SECRET, body, timestamp=stamp))
            assert answered.status_code == 200, answered.content

    [left] = WebhookReceipt.objects.all()
    assert left.signed_at == moment + timedelta(seconds=361)
    assert [s for s, _ in signals_of(run_id)] == ["airline:evt_1", "airline:evt_2"]
