"""A refund agent run's dollars on its run page (issue 28), from real worker processes and the
real `openai` SDK against the suite's stand-in server: the run's cost and what replay saved
for a priced model (`gpt-4o-mini`, priced by genai-prices), "unknown" for one without a price;
each turn names its model and cost."""

from __future__ import annotations

import re
from decimal import Decimal

import genai_prices
import pytest
from django.test import Client

from agentflow import durable
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow.templatetags.agentflow_admin import dollars
from tests.support.admin import detail_url, text
from tests.support.agent_workers import AgentWorker
from tests.support.llm_server import LLMServer
from tests.support.refunds import finished, submit
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)


def figure(page: str, label: str) -> str:
    found = re.search(rf"<dt>{re.escape(label)}</dt><dd>([^<]*)</dd>", page)
    assert found, f"no figure {label!r} on the page"
    return found.group(1)


def price(usage: dict[str, int], model: str) -> Decimal:
    return genai_prices.calc_price(
        genai_prices.Usage(
            input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"]
        ),
        model,
        provider_id="openai",
    ).total_price


def handed_back(run_id: str, seq: int) -> int:
    """How many tasks replayed the call at `seq`: each attempt of every later call, and the
    task that saw the function return."""
    later = StepCheckpoint.objects.filter(run_id=run_id, seq__gt=seq)
    return sum(max(cp.attempts, 1) for cp in later) + 1


@pytest.mark.parametrize("model", ["gpt-4o-mini", "our-own-llama"])
def test_run_page__the_runs_cost_and_what_replay_saved__unknown_without_a_price(
    model: str,
    agent_worker: AgentWorker,
    llm_server: LLMServer,
    clean_sandbox: SandboxProcess,
    admin_client: Client,
) -> None:
    worker = agent_worker(AGENTFLOW_LLM_MODEL=model)
    run_id = submit("AGP001")
    run = finished(run_id, worker, timeout=60)
    assert run.status == durable.RunStatus.COMPLETED, run.error

    page = text(admin_client.get(detail_url(WorkflowRun.objects.get(pk=run_id))))

    turns = list(StepCheckpoint.objects.filter(run_id=run_id, name="llm").order_by("seq"))
    assert len(turns) == 6
    if model == "gpt-4o-mini":
        costs = {t.seq: price(t.output["usage"], model) for t in turns}
        assert figure(page, "cost") == dollars(sum(costs.values()))
        saved = sum(cost * handed_back(run_id, seq) for seq, cost in costs.items())
        assert figure(page, "cost saved by replay") == dollars(saved)
        assert saved > sum(costs.values())  # six turns, each replayed by every later task
        for cost in costs.values():
            assert f"{model} · finished: " in page
            assert f" out · cost {dollars(cost)}</div>" in page
    else:
        assert figure(page, "cost") == "unknown"
        assert figure(page, "cost saved by replay") == "unknown"
        assert page.count(f"{model} · finished: ") == 6
        assert page.count(" out · cost unknown</div>") == 6
        assert "$0.00" not in page  # never shown as free
