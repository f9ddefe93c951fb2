"""The `agent_worker` fixture: real worker processes running refunds as agent runs, their model
the test's local OpenAI-compatible server (`llm_server`), their partners the sandbox."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentflow.testing.processes import WorkerProcess
from refunds.agent.planner import plan_refund
from tests.support.llm_server import LLMServer, planned_by
from tests.support.refunds import refund_worker_env
from tests.support.sandbox import SandboxProcess

AgentWorker = Callable[..., WorkerProcess]


@pytest.fixture
def agent_worker(
    clean_sandbox: SandboxProcess, llm_server: LLMServer, transactional_db: None, settings: Any
) -> Iterator[AgentWorker]:
    """Starts one worker (two pool processes, embedded beat) running refunds as agent runs,
    its model the local server answering as the scripted refund planner would."""
    settings.REFUNDS_ENGINE = "agent"
    settings.REFUNDS_SUBMIT_LIMIT = settings.REFUNDS_BOOKING_LIMIT = 0
    llm_server.script(planned_by(plan_refund))
    started: list[WorkerProcess] = []

    def start(**overrides: str) -> WorkerProcess:
        defaults = {
            "AGENTFLOW_LLM_BASE_URL": llm_server.url,
            "AGENTFLOW_LLM_MODEL": "test-model",
            "AGENTFLOW_LLM_API_KEY": "sk-test",
            "REFUNDS_ENGINE": "agent",
            "REFUNDS_PARTNER_MAX_ATTEMPTS": "4",
            "REFUNDS_PARTNER_RETRY_BASE_SECONDS": "0.25",
        }
        env = refund_worker_env(clean_sandbox, **{**defaults, **overrides})
        worker = WorkerProcess(concurrency=2, env=env, beat=True)
        started.append(worker)
        return worker.start(timeout=60)

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()
