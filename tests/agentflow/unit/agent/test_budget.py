"""The budget's arithmetic (issue 28): worst cases, lost requests, the caps and their
overrides, and a model without a price never counted as free."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest

from agentflow import durable
from agentflow._core import registry
from agentflow.agent import budget
from agentflow.agent.turns import Turns
from agentflow.exceptions import BudgetExceeded, DefinitionError

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]


def test_turns__keep_the_request_size_the_budget_counts_from() -> None:
    turns = Turns(TOOLS)
    messages: list[Any] = [{"role": "system", "content": "Be brief."}]
    turns.observe("m", messages)
    assert turns.latest_size() == budget.request_bytes(messages, TOOLS)
    messages.append({"role": "user", "content": "Hé, où est ma réservation ?"})
    turns.observe("m", messages)
    assert turns.latest_size() == budget.request_bytes(messages, TOOLS)


def test_turns__the_bytes_a_request_added_to_the_one_before__none_when_it_edited_it() -> None:
    turns = Turns(TOOLS)
    system = {"role": "system", "content": "Be brief."}
    messages: list[Any] = [system, {"role": "user", "content": "Hi"}]
    turns.observe("m", messages)
    assert turns.added_bytes() is None  # nothing before it
    assert turns.added_bytes(1) == budget.request_bytes(messages[1:], []) - 2
    answer = {"role": "assistant", "content": "Hello"}
    messages.append(answer)
    turns.observe("m", messages)
    assert turns.added_bytes() == budget.request_bytes([answer], []) - 2
    turns.observe("m", [system, answer])  # not the whole earlier request
    assert turns.added_bytes() is None


def test_prefix_bound__the_reported_tokens_and_a_token_per_added_byte() -> None:
    assert budget.prefix_bound(455, 300) == 755
    worst = budget.worst_case(
        model="gpt-4o-mini", provider="openai", input_tokens=755, max_tokens=100
    )
    assert worst.tokens == 855


def test_worst_case__a_token_per_byte_and_the_max_tokens__priced() -> None:
    worst = budget.worst_case(
        model="gpt-4o-mini", provider="openai", request_bytes=1000, max_tokens=200
    )
    assert worst.tokens == 1000 + budget.REQUEST_OVERHEAD_TOKENS + 200
    assert worst.cost_usd is not None and worst.cost_usd > 0
    unknown = budget.worst_case(
        model="our-own-llama", provider="openai", request_bytes=1000, max_tokens=200
    )
    assert unknown.cost_usd is None


def caps(**kwargs: Any) -> budget.Caps:
    return budget.Caps(**{"max_tokens": 10_000, "max_cost_usd": Decimal("0.01"), **kwargs})


def worst(tokens: int, usd: str | None) -> budget.WorstCase:
    return budget.WorstCase(
        input_tokens=tokens, output_tokens=0, cost_usd=None if usd is None else Decimal(usd)
    )


def test_ledger__lost_requests_count_at_their_worst_until_the_next_could_pass_the_cap() -> None:
    ledger = budget.Ledger()
    ledger.spent(tokens=100, cost_usd=Decimal("0.002"), model="m")
    ledger.lost(worst(1000, "0.004"), requests=1, model="m")
    ledger.check(caps(), worst(1000, "0.004"), model="m")  # 0.002 + 0.004 + 0.004 = 0.01

    ledger.lost(worst(1000, "0.004"), requests=1, model="m")
    with pytest.raises(BudgetExceeded) as caught:
        ledger.check(caps(), worst(1000, "0.004"), model="m")
    assert caught.value.limit == "cost"
    assert caught.value.figures["spent_usd"] == "0.002"
    assert caught.value.figures["lost_usd"] == "0.008"
    assert caught.value.figures["lost_requests"] == 2
    assert str(caught.value) == (
        "Budget reached: $0.002 spent (with up to $0.008 for 2 requests whose answer was "
        "lost), and the next request could cost up to $0.004 more, past the limit of $0.01; "
        "nothing further was asked."
    )


def test_ledger__tokens_capped_too_and_no_dollar_cap_means_none() -> None:
    ledger = budget.Ledger()
    ledger.spent(tokens=9_000, cost_usd=None, model="m")
    ledger.check(caps(max_cost_usd=None), worst(1000, None), model="m")
    with pytest.raises(BudgetExceeded, match="past the limit of 10,000") as caught:
        ledger.check(caps(max_cost_usd=None), worst(1001, None), model="m")
    assert caught.value.limit == "tokens"


def test_ledger__a_dollar_cap_with_a_model_without_a_price__reached_never_free() -> None:
    ledger = budget.Ledger()
    with pytest.raises(BudgetExceeded, match="our-own-llama has no price") as caught:
        ledger.check(caps(), worst(10, None), model="our-own-llama")
    assert caught.value.figures["unpriced_models"] == ["our-own-llama"]


@pytest.fixture
def workflow() -> Iterator[Callable[..., durable.CodeWorkflow]]:
    """Makes workflows (construction registers them) and takes them out of the registry after."""
    made: list[durable.CodeWorkflow] = []

    def make(name: str, **kwargs: Any) -> durable.CodeWorkflow:
        made.append(durable.CodeWorkflow(name, version=1, **kwargs))
        return made[-1]

    yield make
    for each in made:
        registry.unregister(each)


def test_caps__the_workflows_own_win_over_the_settings(
    settings: Any, workflow: Callable[..., durable.CodeWorkflow]
) -> None:
    settings.AGENTFLOW_AGENT_MAX_COST_USD = 2.5
    settings.AGENTFLOW_AGENT_MAX_TOKENS = 1234
    plain = workflow("budget_plain")
    assert budget.Caps.for_workflow(plain) == budget.Caps(
        max_tokens=1234, max_cost_usd=Decimal("2.5"), on_reached="park"
    )
    own = workflow("budget_own", max_tokens=99, max_cost_usd=0.05, on_budget="fail")
    assert budget.Caps.for_workflow(own) == budget.Caps(
        max_tokens=99, max_cost_usd=Decimal("0.05"), on_reached="fail"
    )


@pytest.mark.parametrize("kwargs", [{"on_budget": "shrug"}, {"max_cost_usd": 0}, {"max_tokens": 0}])
def test_workflow__a_budget_that_cannot_hold_is_refused(
    kwargs: dict[str, Any], workflow: Callable[..., durable.CodeWorkflow]
) -> None:
    bad = workflow("budget_bad", **kwargs)
    bad.run(lambda ctx: None)
    with pytest.raises(DefinitionError):
        bad.validate()


def test_budget_exceeded__keeps_its_figures_when_pickled() -> None:
    import pickle

    error = BudgetExceeded("x", limit="cost", used=1, allowed=2, figures={"spent_usd": "0.1"})
    again = pickle.loads(pickle.dumps(error))
    assert (again.limit, again.figures) == ("cost", {"spent_usd": "0.1"})
