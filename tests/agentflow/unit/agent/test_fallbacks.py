"""Model fallback (`agentflow.agent.fallbacks`): the settings' list, the chain's order, and what
the step sees when every server failed."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.test import override_settings

from agentflow.agent import budget, checks
from agentflow.agent.conversation import ModelRequest, ModelResponse, Usage
from agentflow.agent.fallbacks import FallbackModel, ModelServer, fallback_servers
from agentflow.exceptions import PermanentStepError, RetryableStepError

REQUEST = ModelRequest(model="primary", messages=({"role": "user", "content": "hi"},))


class Server:
    def __init__(self, model: str, error: Exception | None = None) -> None:
        self.model, self.error, self.base_url = model, error, f"http://{model}/v1"
        self.asked: list[ModelRequest] = []

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.asked.append(request)
        if self.error is not None:
            raise self.error
        return ModelResponse(
            message={"role": "assistant", "content": "ok"},
            finish_reason="stop",
            usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
            model=request.model,
            server=self.base_url,
        )


def test_servers__json_text_or_a_list__with_what_is_wrong() -> None:
    text = '[{"base_url": "http://b/v1", "model": "m", "api_key": "k"}]'
    assert fallback_servers(text) == [ModelServer(base_url="http://b/v1", model="m", api_key="k")]
    assert fallback_servers([{"base_url": "http://b/v1", "model": "m"}])[0].api_key == ""
    assert fallback_servers("") == fallback_servers([]) == []
    for bad, said in [
        ("{", "not JSON"),
        ('{"base_url": "x"}', "a JSON list"),
        ('[{"model": "m"}]', "'base_url'"),
        ('[{"base_url": "x", "model": "m", "key": "k"}]', "unknown keys"),
    ]:
        with pytest.raises(ValueError, match=said):
            fallback_servers(bad)


def test_primary_down__the_next_answers_for_its_own_model__the_chain_names_the_primary() -> None:
    primary = Server("primary", RetryableStepError("connection refused"))
    backup = Server("backup")
    chain = FallbackModel([primary, backup])

    answer = chain.complete(REQUEST)

    assert chain.model == "primary"  # what the turn's fingerprint names
    assert [r.model for r in primary.asked] == ["primary"]
    assert [r.model for r in backup.asked] == ["backup"]
    assert backup.asked[0].messages == REQUEST.messages
    assert (answer.model, answer.server) == ("backup", "http://backup/v1")


def test_primary_refuses_permanently__the_next_is_still_asked() -> None:
    chain = FallbackModel([Server("primary", PermanentStepError("HTTP 404")), Server("backup")])
    assert chain.complete(REQUEST).model == "backup"


def test_all_fail__retryable_if_any_was__with_every_reason() -> None:
    chain = FallbackModel(
        [
            Server("primary", PermanentStepError("HTTP 403")),
            Server("backup", RetryableStepError("HTTP 503", retry_after_seconds=2)),
        ]
    )
    with pytest.raises(
        RetryableStepError, match=r"primary at .*HTTP 403.*backup at .*HTTP 503"
    ) as e:
        chain.complete(REQUEST)
    assert e.value.retry_after_seconds == 2
    refused = FallbackModel(
        [Server("a", PermanentStepError("x")), Server("b", PermanentStepError("y"))]
    )
    with pytest.raises(PermanentStepError, match="every model server refused"):
        refused.complete(REQUEST)


def test_worst_case_of_a_chain__adds_every_server_up__unknown_if_one_is_unpriced() -> None:
    one = budget.worst_case(
        model="gpt-4o-mini", provider="openai", request_bytes=100, max_tokens=10
    )
    two = budget.chain_worst_case(
        [("gpt-4o-mini", "openai"), ("gpt-4o-mini", "openai")], request_bytes=100, max_tokens=10
    )
    assert two.tokens == 2 * one.tokens
    assert one.cost_usd is not None and two.cost_usd == 2 * one.cost_usd
    unpriced = budget.chain_worst_case(
        [("gpt-4o-mini", "openai"), ("our-own-llama", "openai")], request_bytes=100, max_tokens=10
    )
    assert unpriced.cost_usd is None
    assert Decimal(0) < one.cost_usd


def test_check__a_bad_list_or_one_without_a_primary() -> None:
    with override_settings(AGENTFLOW_LLM_FALLBACKS="[1]", AGENTFLOW_LLM_BASE_URL="http://a/v1"):
        assert [m.id for m in checks.model_settings()] == ["agentflow.E001", "agentflow.E010"]
    fine = '[{"base_url": "http://b/v1", "model": "m"}]'
    with override_settings(
        AGENTFLOW_LLM_FALLBACKS=fine, AGENTFLOW_LLM_BASE_URL="http://a/v1", AGENTFLOW_LLM_MODEL="x"
    ):
        assert checks.model_settings() == []
    with override_settings(AGENTFLOW_LLM_FALLBACKS=fine, AGENTFLOW_LLM_BASE_URL=""):
        assert [m.id for m in checks.model_settings()] == ["agentflow.E010"]
