"""An agent run's dollars (issue 28): each turn priced by genai-prices as it is recorded, the
metrics counters by workflow and model, and a model without a price counted as unpriced,
never as free. The model is the real `openai` SDK against the suite's stand-in server."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal
from typing import Any

import genai_prices
import pytest

from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow.models import StepCheckpoint, WorkflowRun
from tests.agentflow.integration.test_ops_views import scrape, value
from tests.support import workflows
from tests.support.llm_server import LLMServer, planned_by

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

SPENT, SAVED = "agentflow_model_cost_usd_total", "agentflow_model_cost_saved_usd_total"
UNPRICED = "agentflow_model_turns_unpriced_total"


@pytest.fixture
def served(llm_server: LLMServer, settings: Any) -> Callable[[str], None]:
    settings.AGENTFLOW_METRICS_PUBLIC = True  # DEBUG is off in tests: /metrics is closed
    llm_server.script(planned_by(workflows.shopping_plan))

    def model(name: str) -> None:
        settings.AGENTFLOW_LLM_BASE_URL = llm_server.url
        settings.AGENTFLOW_LLM_MODEL = name

    return model


def turns(run_id: str) -> dict[int, dict[str, Any]]:
    return {cp.seq: cp.output for cp in StepCheckpoint.objects.filter(run_id=run_id, name="llm")}


def test_priced_model__each_turn_keeps_its_cost_and_the_counters_add_it_and_the_savings(
    served: Callable[[str], None], drive: Callable[[str], WorkflowRun], client: Any
) -> None:
    served("gpt-4o-mini")
    labels = {"workflow": workflows.agent.name, "model": "gpt-4o-mini"}
    before = scrape(client)
    run_id = durable.start(workflows.agent.name)

    assert drive(run_id).status == RunStatus.COMPLETED
    after = scrape(client)

    recorded = turns(run_id)
    costs = {}
    for seq, output in recorded.items():
        usage = output["usage"]
        price = genai_prices.calc_price(
            genai_prices.Usage(
                input_tokens=usage["prompt_tokens"], output_tokens=usage["completion_tokens"]
            ),
            "gpt-4o-mini",
            provider_id="openai",
        ).total_price
        assert price > 0
        assert Decimal(output["cost_usd"]) == price
        costs[seq] = price
    spent = value(after, SPENT, **labels) - value(before, SPENT, **labels)
    assert spent == pytest.approx(float(sum(costs.values())))
    # Every later task (positions 2..6 and the one that found the answer) replays each turn
    # before it: a turn at position p is handed back 6 - p + 1 times.
    saved = value(after, SAVED, **labels) - value(before, SAVED, **labels)
    assert saved == pytest.approx(float(sum(c * (6 - seq + 1) for seq, c in costs.items())))
    assert value(after, UNPRICED, **labels) == value(before, UNPRICED, **labels)


def test_unpriced_model__its_cost_is_recorded_unknown_and_counted_as_unpriced_not_zero(
    served: Callable[[str], None], drive: Callable[[str], WorkflowRun], client: Any
) -> None:
    served("our-own-llama")
    labels = {"workflow": workflows.agent.name, "model": "our-own-llama"}
    before = scrape(client)
    run_id = durable.start(workflows.agent.name)

    assert drive(run_id).status == RunStatus.COMPLETED
    after = scrape(client)

    recorded = turns(run_id)
    assert recorded and all(output["cost_usd"] is None for output in recorded.values())
    unpriced = value(after, UNPRICED, **labels) - value(before, UNPRICED, **labels)
    assert unpriced == len(recorded)
    assert (SPENT, tuple(sorted(labels.items()))) not in after
