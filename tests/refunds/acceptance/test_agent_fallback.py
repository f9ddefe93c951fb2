"""Model fallback under real workers (issue 28): the primary model server refusing connections
(or answering 503), the fallback in `AGENTFLOW_LLM_FALLBACKS` answers every turn, the run
completes, its page names the model of each turn; with the worker killed right after every
turn is recorded, the replays ask neither server again."""

from __future__ import annotations

import json
import socket
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.test import Client

from agentflow import durable
from agentflow.models import StepCheckpoint, WorkflowRun
from tests.support.admin import detail_url, text
from tests.support.agent_workers import AgentWorker
from tests.support.llm_server import LLMServer, fail
from tests.support.refunds import finished, partner_effects, submit
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

TURNS = 6  # a refund agent run's model turns


@contextmanager
def refusing() -> Iterator[str]:
    """A loopback port bound and never listened on: every connection to it is refused."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        sock.close()


@contextmanager
def unavailable() -> Iterator[LLMServer]:
    """A model server that answers every request 503 (and counts them)."""
    server = LLMServer(lambda seen: fail(503, "overloaded")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("primary", ["refusing connections", "answering 503"])
def test_primary_down__the_fallback_answers_each_turn_once__page_names_it__replays_ask_neither(
    primary: str,
    agent_worker: AgentWorker,
    llm_server: LLMServer,
    clean_sandbox: SandboxProcess,
    admin_client: Client,
) -> None:
    with refusing() as refused_url, unavailable() as down:
        url = refused_url if primary == "refusing connections" else down.url
        fallbacks = [{"base_url": llm_server.url, "model": "gpt-4o-mini", "api_key": "sk-backup"}]
        worker = agent_worker(
            AGENTFLOW_LLM_BASE_URL=url,
            AGENTFLOW_LLM_MODEL="primary-model",
            AGENTFLOW_LLM_FALLBACKS=json.dumps(fallbacks),
            # Killed right after each turn is recorded: every turn is then replayed.
            AGENTFLOW_FAULTS="1",
            AGENTFLOW_CRASH_AT="llm:after_complete",
        )
        run_id = submit("AGF001")
        run = finished(run_id, worker, timeout=120)
        asked_primary = Counter(seen.turn for seen in down.requests)

    assert "fault injection: SIGKILL at llm:after_complete" in worker.log_tail(4000)
    assert run.status == durable.RunStatus.COMPLETED, run.error
    # The fallback answered each turn once, for its own model with its own key; the replays
    # after the crashes asked it nothing again.
    assert Counter(seen.turn for seen in llm_server.requests) == dict.fromkeys(range(1, 7), 1)
    assert {seen.body["model"] for seen in llm_server.requests} == {"gpt-4o-mini"}
    assert {seen.headers["authorization"] for seen in llm_server.requests} == {"Bearer sk-backup"}
    if primary == "answering 503":  # ... nor the primary: once per turn, before the fallback
        assert asked_primary == dict.fromkeys(range(1, 7), 1)
    turns = list(StepCheckpoint.objects.filter(run_id=run_id, name="llm").order_by("seq"))
    assert len(turns) == TURNS
    for turn in turns:
        assert turn.output["model"] == "gpt-4o-mini"
        assert turn.output["server"] == llm_server.url
        assert turn.arguments["arguments"]["model"] == "primary-model"  # the request's
    ledger = partner_effects(clean_sandbox, run_id)
    assert len(ledger["payments"]) == 1 and ledger["refunds"] == []

    page = text(admin_client.get(detail_url(WorkflowRun.objects.get(pk=run_id))))
    assert page.count("gpt-4o-mini · finished: ") == TURNS
    assert "primary-model · finished" not in page
