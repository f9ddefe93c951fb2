"""Signals with real worker processes (issue 29): a signal sent before its run reaches
`wait_for` is kept and taken there, once and in the order sent, even across a SIGKILL between
the take and the step's checkpoint; one sent from a shell and one from a signed partner webhook
reach a run a worker is running; a run that waited for an approval shows the wait on its
timeline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.admin.utils import quote
from django.test import Client

from agentflow import durable, webhooks
from agentflow._base.states import RunStatus
from agentflow.models import RunEvent, RunSignal, RunWait, StepCheckpoint, WebhookReceipt
from tests.agentflow.acceptance.test_engine_crashes import wait_execution, wait_finished
from tests.agentflow.acceptance.test_waits_crashes import assert_completed_once, waiting_for
from tests.support import partner, workflows
from tests.support.processes import EnvBuilder, Workers, log_has
from tests.support.timelines import box, elements, title

pytestmark = pytest.mark.django_db(transaction=True)

#: What `two_replies` finishes with when its waits took {"n": 1}, then {"n": 2}.
IN_ORDER = {"first": {"payload": {"n": 1}}, "second": {"payload": {"n": 2}}}
WAITS = ("first", "second")


def send_early(run_id: str) -> None:
    """While the run is held in its first step, far from its waits: two signals of one name,
    and the first one's id again."""
    wait_execution(run_id, "prepare")
    assert durable.signal(run_id, "reply", {"n": 1}, signal_id="sms-1") == "delivered"
    assert durable.signal(run_id, "reply", {"n": 9}, signal_id="sms-1") == "duplicate"
    assert durable.signal(run_id, "reply", {"n": 2}, signal_id="sms-2") == "delivered"
    assert durable.snapshot(run_id).waiting_for is None  # type: ignore[union-attr]


def assert_taken_in_order(run_id: str) -> None:
    finish = StepCheckpoint.objects.get(run_id=run_id, name="finish")
    assert finish.output == IN_ORDER
    signals = RunSignal.objects.filter(run_id=run_id).order_by("seq")
    assert [(s.signal_id, s.payload, s.seq) for s in signals] == [
        ("sms-1", {"n": 1}, 2),
        ("sms-2", {"n": 2}, 3),
    ]


def test_early_signals__taken_when_the_run_gets_there__in_order__once__without_waiting(
    workers: Workers,
) -> None:
    workers.start()
    run_id = durable.start(workflows.two_replies.name)
    send_early(run_id)

    partner.release(run_id)
    run = wait_finished(run_id)

    assert run.status == RunStatus.COMPLETED, run.error
    assert_completed_once(run_id, waits=WAITS)
    assert_taken_in_order(run_id)
    # Neither wait waited: each was resolved in the commit that recorded it.
    waits = RunWait.objects.filter(run_id=run_id)
    assert [(w.seq, w.resolved_at == w.requested_at) for w in waits] == [(2, True), (3, True)]


def test_early_signal__worker_killed_between_the_take_and_the_checkpoint__taken_once(
    workers: Workers,
) -> None:
    """The pool child SIGKILLs itself after the first wait took sms-1 (committed with the
    wait's outcome) and before the step's checkpoint; the redelivery reads the same signal
    back from the wait and leaves sms-2 for the second wait."""
    worker = workers.start(AGENTFLOW_FAULTS="1", AGENTFLOW_CRASH_AT="first:after_effect")
    run_id = durable.start(workflows.two_replies.name)
    send_early(run_id)

    partner.release(run_id)
    run = wait_finished(run_id)

    assert log_has(worker, "fault injection: SIGKILL at first:after_effect")
    assert run.status == RunStatus.COMPLETED, run.error
    assert_completed_once(run_id, waits=WAITS)
    assert_taken_in_order(run_id)
    assert StepCheckpoint.objects.get(run_id=run_id, seq=2).attempts == 2  # one was lost
    taken = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SIGNAL, seq__isnull=False)
    assert [e.data["signal_id"] for e in taken] == ["sms-1", "sms-2"]  # each taken once


def test_agentflow_signal__from_a_shell__reaches_the_run_a_worker_runs(
    workers: Workers, worker_env: EnvBuilder
) -> None:
    workers.start()
    run_id = durable.start(workflows.signalled.name)
    waiting_for(run_id, "signal")
    command = [sys.executable, "manage.py", "agentflow_signal", run_id, "reply"]
    shell = {**os.environ, **worker_env()}  # the site's settings: its database, its broker

    said = [
        subprocess.run(
            [*command, "--payload", payload, "--signal-id", "ops-1"],
            cwd=django_settings.BASE_DIR,
            env=shell,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        for payload in ('{"text": "yes"}', '{"text": "twice"}')
    ]
    run = wait_finished(run_id)

    assert [s.returncode for s in said] == [0, 0], [s.stderr for s in said]
    assert said[0].stdout.startswith(f"delivered signal 'reply' to {run_id}")
    assert said[1].stdout.startswith("duplicate: signal id ops-1")
    assert run.status == RunStatus.COMPLETED, run.error
    assert_completed_once(run_id, waits=("reply",))
    reply = StepCheckpoint.objects.get(run_id=run_id, name="reply")
    assert reply.output == {"payload": {"text": "yes"}}


def test_webhook__a_signed_one_reaches_the_run__forged_stale_or_replayed_ones_do_not(
    workers: Workers, settings: Any
) -> None:
    settings.ROOT_URLCONF = "tests.support.webhook_urls"
    settings.AGENTFLOW_WEBHOOK_SECRETS = {"airline": "whsec_test"}
    workers.start()
    run_id = durable.start(workflows.signalled.name)
    waiting_for(run_id, "signal")
    client = Client()

    def send(body: bytes, header: str) -> Any:
        headers = {webhooks.SIGNATURE_HEADER: header}
        return client.post("/hooks/airline/", body, "application/json", headers=headers)

    def signed(event: str, text: str, secret: str = "whsec_test", age: int = 0) -> Any:
        message = {"id": event, "run_id": run_id, "signal": "reply", "payload": {"text": text}}
        body = json.dumps(message).encode()
        return body, webhooks.sign(secret, body, timestamp=int(time.time()) - age)

    forged = send(*signed("evt_0", "forged", secret="whsec_guess"))
    stale = send(*signed("evt_0", "stale", age=301))
    request = signed("evt_1", "rebooked")
    sent = [send(*request), send(*request)]  # the second is the same signed request: a replay
    run = wait_finished(run_id)

    assert (forged.status_code, stale.status_code) == (400, 400)
    assert [s.status_code for s in sent] == [200, 400]
    assert "replay" in sent[1].json()["error"]
    assert run.status == RunStatus.COMPLETED, run.error
    reply = StepCheckpoint.objects.get(run_id=run_id, name="reply")
    assert reply.output == {"payload": {"text": "rebooked"}}
    assert list(RunSignal.objects.filter(run_id=run_id).values_list("signal_id")) == [
        ("airline:evt_1",)
    ]
    assert WebhookReceipt.objects.count() == 1


def test_timeline__a_run_that_waited_for_an_approval__shows_the_wait(
    workers: Workers, admin_client: Client
) -> None:
    workers.start()
    run_id = durable.start(workflows.approval.name, input={"amount": 4500})
    waiting_for(run_id, "approval")
    durable.approve(run_id, actor="alice", reason="fee confirmed")
    assert wait_finished(run_id).status == RunStatus.COMPLETED

    page = admin_client.get(f"/admin/agentflow/workflowrun/{quote(run_id)}/change/")
    svg = page.content.decode().split('<svg class="af-timeline-svg"', 1)[1]
    svg = '<svg class="af-timeline-svg"' + svg.split("</svg>", 1)[0] + "</svg>"

    [bar] = elements(svg, "af-tl-wait-bar")
    assert (bar.get("data-seq"), bar.get("data-kind"), bar.get("data-ended")) == (
        "2",
        "approval",
        "approved",
    )
    assert "waited for approval of charge: approved by alice" in title(bar)
    [charge] = [a for a in elements(svg, "af-tl-attempt") if a.get("data-seq") == "2"]
    assert box(bar)[0] < box(charge)[0]  # the wait came before the call it gated
    wait = RunWait.objects.get(run_id=run_id)
    assert wait.resolved_at is not None and wait.resolved_at > wait.requested_at
