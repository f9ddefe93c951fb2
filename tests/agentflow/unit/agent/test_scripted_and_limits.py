"""The scripted model (deterministic turns), conversation values and the turn/token limits."""

from __future__ import annotations

import json
import pickle

import pytest

from agentflow.agent.conversation import (
    ModelRequest,
    ModelResponse,
    system_message,
    tool_exchanges,
    tool_result_message,
    user_message,
)
from agentflow.agent.limits import AgentLimits
from agentflow.agent.scripted import Plan, ScriptedModel, answer, call, calls, estimate_tokens
from agentflow.exceptions import BudgetExceeded, PermanentStepError

TOOLS = (
    {"type": "function", "function": {"name": "lookup", "description": "d", "parameters": {}}},
)


def planner(request: ModelRequest) -> Plan:
    done = [exchange.call.name for exchange in tool_exchanges(request.messages)]
    if not done:
        return calls(call("lookup", ref="ABC123"), call("lookup", ref="XYZ789"))
    return answer(f"Looked up {len(done)} bookings.")


def first_request() -> ModelRequest:
    return ModelRequest(
        model="scripted-test", messages=(system_message("s"), user_message("u")), tools=TOOLS
    )


def test_scripted__several_calls_in_one_turn_with_stable_ids() -> None:
    response = ScriptedModel("scripted-test", planner).complete(first_request())

    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_1_1", "lookup", {"ref": "ABC123"}),
        ("call_1_2", "lookup", {"ref": "XYZ789"}),
    ]
    assert response.finish_reason == "tool_calls" and not response.is_final
    assert response.model == "scripted-test"
    assert (
        response.usage.total_tokens
        == response.usage.prompt_tokens + response.usage.completion_tokens
        > 0
    )


def test_scripted__the_same_conversation_gets_the_same_answer() -> None:
    model = ScriptedModel("scripted-test", planner)
    assert model.complete(first_request()) == model.complete(first_request())


def test_scripted__a_final_answer_ends_the_loop() -> None:
    model = ScriptedModel("scripted-test", planner)
    first = model.complete(first_request())
    messages = (
        *first_request().messages,
        first.message,
        *(tool_result_message(c.id, {"ok": c.arguments["ref"]}) for c in first.tool_calls),
    )

    second = model.complete(ModelRequest(model="scripted-test", messages=messages, tools=TOOLS))

    assert second.is_final and second.text == "Looked up 2 bookings."
    assert second.finish_reason == "stop"
    assert second.message == {"role": "assistant", "content": "Looked up 2 bookings."}


def test_response__json_round_trip_is_exact() -> None:
    response = ScriptedModel("scripted-test", planner).complete(first_request())
    stored = json.loads(json.dumps(response.as_json()))
    assert ModelResponse.from_json(stored) == response


def test_plan__has_calls_or_an_answer_never_both_nor_neither() -> None:
    with pytest.raises(ValueError):
        Plan()
    with pytest.raises(ValueError):
        Plan(calls=(call("x"),), answer="done")


def test_request__turn_counts_assistant_messages() -> None:
    assert first_request().turn == 1
    later = ModelRequest(
        model="m", messages=(user_message("u"), {"role": "assistant", "content": "a"})
    )
    assert later.turn == 2


def test_tool_exchanges__pairs_calls_with_results_by_id() -> None:
    response = ScriptedModel("scripted-test", planner).complete(first_request())
    first, second = response.tool_calls
    messages = [
        *first_request().messages,
        response.message,
        tool_result_message(second.id, {"seat": "1A"}),
    ]

    exchanges = tool_exchanges(messages)

    assert [(e.call.id, e.answered, e.result) for e in exchanges] == [
        (first.id, False, None),
        (second.id, True, {"seat": "1A"}),
    ]


def test_tool_result_message__deterministic_readable_json() -> None:
    message = tool_result_message("call_1_1", {"b": 1.0, "a": "Bjørn"})
    assert message == {"role": "tool", "tool_call_id": "call_1_1", "content": '{"a":"Bjørn","b":1}'}


def test_arguments_that_are_not_json__stay_text() -> None:
    from agentflow.agent.conversation import ToolCall

    broken = ToolCall(id="c", name="lookup", arguments_text='{"ref": "ABC')
    assert broken.arguments == '{"ref": "ABC' and not broken.arguments_are_json


def test_estimate_tokens__a_quarter_of_the_json_text() -> None:
    assert estimate_tokens("x" * 398) == 100  # 400 characters with the quotes


# --- limits ------------------------------------------------------------------------------------
LIMITS = AgentLimits(max_turns=3, max_tokens=1000, max_tool_calls=5, max_tool_calls_per_turn=2)


def test_limits__within_both_passes() -> None:
    LIMITS.check_turn(turns_taken=2, tokens_used=1000)
    LIMITS.check_tokens(tokens_used=1000)


def test_limits__no_turn_left_is_permanent_and_readable() -> None:
    with pytest.raises(BudgetExceeded) as caught:
        LIMITS.check_turn(turns_taken=3, tokens_used=10)
    assert isinstance(caught.value, PermanentStepError)
    assert str(caught.value) == "The agent used all 3 of its model turns without finishing."
    assert (caught.value.limit, caught.value.used, caught.value.allowed) == ("turns", 3, 3)


def test_limits__tokens_over_the_limit_stop_tools_and_turns() -> None:
    with pytest.raises(BudgetExceeded, match="spent 1,001 tokens, over its limit of 1,000"):
        LIMITS.check_tokens(tokens_used=1001)
    with pytest.raises(BudgetExceeded, match="tokens"):
        LIMITS.check_turn(turns_taken=0, tokens_used=1001)


def test_limits__error_crosses_process_boundaries() -> None:
    with pytest.raises(BudgetExceeded) as caught:
        LIMITS.check_tokens(tokens_used=5000)
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (str(copy), copy.limit, copy.used, copy.allowed) == (
        str(caught.value),
        "tokens",
        5000,
        1000,
    )


def test_limits__from_settings(settings) -> None:  # type: ignore[no-untyped-def]
    settings.AGENTFLOW_AGENT_MAX_TURNS = 7
    settings.AGENTFLOW_AGENT_MAX_TOKENS = 1234
    settings.AGENTFLOW_AGENT_MAX_TOOL_CALLS = 30
    assert AgentLimits.from_settings() == AgentLimits(
        max_turns=7, max_tokens=1234, max_tool_calls=30, max_tool_calls_per_turn=10
    )
    assert AgentLimits.from_settings(max_tool_calls_per_turn=4).max_tool_calls_per_turn == 4
    settings.AGENTFLOW_AGENT_MAX_TOOL_CALLS = 3  # a turn never may make more than the run
    assert AgentLimits.from_settings().max_tool_calls_per_turn == 3


def test_tool_call_caps__past_the_turn_s_or_the_run_s_share_a_call_is_refused() -> None:
    assert LIMITS.tool_call_refusal(in_turn=2, in_run=4) is None
    assert LIMITS.tool_call_refusal(in_turn=3, in_run=0) == (
        "one turn may make at most 2 tool calls; this was call 3 of the turn"
    )
    assert LIMITS.tool_call_refusal(in_turn=1, in_run=5) == (
        "this run has made all 5 of the tool calls it may make"
    )
