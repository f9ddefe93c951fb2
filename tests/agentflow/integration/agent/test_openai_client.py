"""The OpenAI-compatible client through the real `openai` SDK against the local test server.

No mock of the SDK: every request crosses HTTP to tests/support/llm_server.py, which counts
them, so "the SDK's own retries are off" is proven by the server's count.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from django.conf import settings

from agentflow.agent.clients import configured_client
from agentflow.agent.conversation import (
    ModelRequest,
    ModelResponse,
    system_message,
    tool_result_message,
    user_message,
)
from agentflow.agent.openai_chat import OpenAIChatModel, retry_after_seconds
from agentflow.agent.scripted import ScriptedModel, answer
from agentflow.exceptions import PermanentStepError, RetryableStepError
from tests.support.llm_server import (
    LLMServer,
    fail,
    reply,
    requests_seen,
    stall,
    tool_calls,
)

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "fetch_booking",
            "description": "Look a booking up.",
            "parameters": {
                "type": "object",
                "properties": {"booking_reference": {"type": "string"}},
                "required": ["booking_reference"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "check_cancellation_policy",
            "description": "The fee for changing a booking.",
            "parameters": {
                "type": "object",
                "properties": {"booking_reference": {"type": "string"}},
                "required": ["booking_reference"],
            },
        },
    },
)
FIRST = ModelRequest(
    model="test-model",
    messages=(system_message("You rebook flights."), user_message("Refund request: rf_1")),
    tools=TOOLS,
)


def client(server: LLMServer, **options: object) -> OpenAIChatModel:
    settings = {"base_url": server.url, "model": "test-model", "api_key": "sk-test", **options}
    return OpenAIChatModel(**settings)  # type: ignore[arg-type]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_tool_calls__in_order_with_finish_reason_and_usage(llm_server: LLMServer) -> None:
    llm_server.script(
        [
            tool_calls(
                ("fetch_booking", {"booking_reference": "ABC123"}),
                ("check_cancellation_policy", {"booking_reference": "ABC123"}),
            )
        ]
    )

    response = client(llm_server).complete(FIRST)

    assert [(c.id, c.name, c.arguments) for c in response.tool_calls] == [
        ("call_1_1", "fetch_booking", {"booking_reference": "ABC123"}),
        ("call_1_2", "check_cancellation_policy", {"booking_reference": "ABC123"}),
    ]
    assert response.finish_reason == "tool_calls" and not response.is_final
    assert response.model == "test-model"
    usage = response.usage
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    [seen] = llm_server.requests
    assert seen.body["model"] == "test-model"
    assert seen.body["messages"] == list(FIRST.messages)
    assert seen.body["tools"] == list(TOOLS)
    assert seen.headers["authorization"] == "Bearer sk-test"


def test_response__plain_json_that_replays_exactly(llm_server: LLMServer) -> None:
    llm_server.script([tool_calls(("fetch_booking", {"booking_reference": "ABC123"}))])

    response = client(llm_server).complete(FIRST)
    stored = json.loads(json.dumps(response.as_json()))  # what a checkpoint holds

    assert ModelResponse.from_json(stored) == response
    assert response.message == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1_1",
                "type": "function",
                "function": {
                    "name": "fetch_booking",
                    "arguments": '{"booking_reference": "ABC123"}',
                },
            }
        ],
    }


def test_conversation__recorded_turns_and_tool_results_go_back_as_sent(
    llm_server: LLMServer,
) -> None:
    llm_server.script(
        [tool_calls(("fetch_booking", {"booking_reference": "ABC123"})), reply("You are rebooked.")]
    )
    model = client(llm_server)
    first = model.complete(FIRST)
    [call] = first.tool_calls
    second_request = ModelRequest(
        model="test-model",
        messages=(*FIRST.messages, first.message, tool_result_message(call.id, {"seat": "12C"})),
        tools=TOOLS,
    )

    second = model.complete(second_request)

    assert second.is_final and second.text == "You are rebooked." and second.finish_reason == "stop"
    assert llm_server.requests[1].turn == 2
    assert llm_server.requests[1].messages[-1] == {
        "role": "tool",
        "tool_call_id": "call_1_1",
        "content": '{"seat":"12C"}',
    }


def test_no_tools__the_request_carries_none(llm_server: LLMServer) -> None:
    llm_server.script([reply("hello")])
    client(llm_server).complete(ModelRequest(model="test-model", messages=FIRST.messages))
    assert "tools" not in llm_server.requests[0].body


def test_broken_tool_arguments__kept_as_text_for_the_registry(llm_server: LLMServer) -> None:
    llm_server.script([tool_calls(("fetch_booking", '{"booking_reference": "ABC'))])

    [call] = client(llm_server).complete(FIRST).tool_calls

    assert call.arguments_text == '{"booking_reference": "ABC' and not call.arguments_are_json


# --- errors: retryable ---------------------------------------------------------------------------
def test_429__retryable_with_retry_after_and_one_request(llm_server: LLMServer) -> None:
    llm_server.fail_next(fail(429, "Rate limit reached for test-model", retry_after=7))

    with pytest.raises(RetryableStepError) as caught:
        client(llm_server).complete(FIRST)

    assert caught.value.retry_after_seconds == 7
    assert "HTTP 429: Rate limit reached for test-model" in str(caught.value)
    assert llm_server.count() == 1  # the SDK did not retry on its own


def test_429__retry_after_as_an_http_date(llm_server: LLMServer) -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    llm_server.fail_next(fail(429, retry_after=format_datetime(when, usegmt=True)))

    with pytest.raises(RetryableStepError) as caught:
        client(llm_server).complete(FIRST)

    assert 25 <= (caught.value.retry_after_seconds or 0) <= 30


@pytest.mark.parametrize("status", [500, 502, 503, 408, 409])
def test_server_errors__retryable_without_sdk_retries(llm_server: LLMServer, status: int) -> None:
    llm_server.fail_next(fail(status, "overloaded"))

    with pytest.raises(RetryableStepError, match=rf"HTTP {status}: overloaded") as caught:
        client(llm_server).complete(FIRST)

    assert caught.value.retry_after_seconds is None
    assert llm_server.count() == 1


def test_timeout__retryable_and_says_how_long(llm_server: LLMServer) -> None:
    llm_server.fail_next(stall(30))

    with pytest.raises(RetryableStepError, match=r"did not answer within 0.5 s"):
        client(llm_server, timeout_seconds=0.5).complete(FIRST)

    assert llm_server.count() == 1


def test_connection_refused__retryable() -> None:
    model = OpenAIChatModel(base_url=f"http://127.0.0.1:{closed_port()}/v1", model="m")
    with pytest.raises(
        RetryableStepError, match=r"could not reach the model server at http://127\.0\.0\.1:"
    ):
        model.complete(FIRST)


def test_after_a_fault__the_next_request_gets_the_script(llm_server: LLMServer) -> None:
    llm_server.script([reply("fine now")])
    llm_server.fail_next(fail(503))
    model = client(llm_server)

    with pytest.raises(RetryableStepError):
        model.complete(FIRST)
    assert model.complete(FIRST).text == "fine now"
    assert llm_server.count(turn=1) == 2


# --- errors: permanent ---------------------------------------------------------------------------
def test_400__permanent_with_the_servers_reason(llm_server: LLMServer) -> None:
    llm_server.fail_next(fail(400, "Invalid schema for function 'fetch_booking'"))

    with pytest.raises(PermanentStepError) as caught:
        client(llm_server).complete(FIRST)

    assert str(caught.value) == (
        "the model server refused the request (HTTP 400: Invalid schema for function "
        "'fetch_booking')"
    )
    assert llm_server.count() == 1


def test_400__a_tool_call_left_unanswered_is_refused_like_a_real_server(
    llm_server: LLMServer,
) -> None:
    llm_server.script([tool_calls(("fetch_booking", {"booking_reference": "ABC123"}))])
    model = client(llm_server)
    first = model.complete(FIRST)
    bad = ModelRequest(
        model="test-model",
        messages=(*FIRST.messages, first.message, user_message("and?")),
        tools=TOOLS,
    )

    with pytest.raises(PermanentStepError, match=r"missing: call_1_1"):
        model.complete(bad)


def test_401__permanent_and_names_the_setting(llm_server: LLMServer) -> None:
    llm_server.fail_next(fail(401, "Incorrect API key provided"))
    with pytest.raises(
        PermanentStepError,
        match=r"rejected our credentials \(HTTP 401: Incorrect API key provided\); "
        r"check AGENTFLOW_LLM_API_KEY",
    ):
        client(llm_server).complete(FIRST)


def test_403__permanent(llm_server: LLMServer) -> None:
    llm_server.fail_next(fail(403, "Project does not have access"))
    with pytest.raises(
        PermanentStepError, match=r"refused access to model 'test-model' \(HTTP 403"
    ):
        client(llm_server).complete(FIRST)


def test_404__permanent_and_names_model_and_url(llm_server: LLMServer) -> None:
    llm_server.fail_next(fail(404, "The model 'test-model' does not exist"))
    with pytest.raises(PermanentStepError) as caught:
        client(llm_server).complete(FIRST)
    message = str(caught.value)
    assert "no model 'test-model'" in message and llm_server.url in message
    assert "check AGENTFLOW_LLM_MODEL and AGENTFLOW_LLM_BASE_URL" in message


def test_422__permanent(llm_server: LLMServer) -> None:
    llm_server.fail_next(fail(422, "messages: unprocessable"))
    with pytest.raises(PermanentStepError, match=r"HTTP 422: messages: unprocessable"):
        client(llm_server).complete(FIRST)


def test_script_without_an_answer__a_clear_permanent_error(llm_server: LLMServer) -> None:
    with pytest.raises(PermanentStepError, match="no answer for turn 1"):
        client(llm_server).complete(FIRST)


# --- settings ------------------------------------------------------------------------------------
def test_from_settings__base_url_model_key_and_timeout(llm_server: LLMServer, settings) -> None:  # type: ignore[no-untyped-def]
    settings.AGENTFLOW_LLM_BASE_URL = llm_server.url
    settings.AGENTFLOW_LLM_MODEL = "served-model"
    settings.AGENTFLOW_LLM_API_KEY = "sk-from-settings"
    settings.AGENTFLOW_LLM_TIMEOUT_SECONDS = 9
    llm_server.script([reply("ok")])
    offline = ScriptedModel("scripted", lambda request: answer("offline"))

    chosen = configured_client(offline)

    assert isinstance(chosen, OpenAIChatModel)
    assert (chosen.model, chosen.timeout_seconds) == ("served-model", 9)
    chosen.complete(ModelRequest(model=chosen.model, messages=FIRST.messages))
    [seen] = llm_server.requests
    assert seen.body["model"] == "served-model"
    assert seen.headers["authorization"] == "Bearer sk-from-settings"


def test_without_a_base_url__the_scripted_default(settings) -> None:  # type: ignore[no-untyped-def]
    settings.AGENTFLOW_LLM_BASE_URL = ""
    offline = ScriptedModel("scripted", lambda request: answer("offline"))
    assert configured_client(offline) is offline


def test_settings__base_url_without_a_model_fails_loudly() -> None:
    env = {
        **os.environ,
        "AGENTFLOW_LLM_BASE_URL": "http://127.0.0.1:1/v1",
        "AGENTFLOW_LLM_MODEL": "",
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "check"],
        env=env,
        capture_output=True,
        text=True,
        cwd=settings.BASE_DIR,
        timeout=120,
    )
    assert result.returncode != 0
    assert "agentflow.E001" in result.stderr and "AGENTFLOW_LLM_MODEL is empty" in result.stderr


def test_request_log__readable_over_http_from_any_process(llm_server: LLMServer) -> None:
    llm_server.script([reply("one")])
    client(llm_server).complete(FIRST)

    [seen] = requests_seen(llm_server.url)

    assert (seen["number"], seen["turn"], seen["body"]["model"]) == (1, 1, "test-model")


# --- Retry-After parsing (pure) -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "1.5"}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after": "inf"}, None),
        ({"retry-after": "-3"}, None),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}, 0.0),  # in the past
        ({}, None),
    ],
)
def test_retry_after_seconds(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_seconds(headers) == expected


def test_scripts__by_turn_dict_or_function_of_the_request(llm_server: LLMServer) -> None:
    model = client(llm_server)
    second_turn = ModelRequest(
        model="test-model",
        messages=(*FIRST.messages, {"role": "assistant", "content": "Which flight?"}),
    )

    llm_server.script({2: reply("second turn")})
    assert model.complete(second_turn).text == "second turn"
    with pytest.raises(PermanentStepError, match="no answer for turn 1"):
        model.complete(FIRST)

    llm_server.script(lambda seen: reply(f"turn {seen.turn}, {len(seen.messages)} messages"))
    assert model.complete(second_turn).text == "turn 2, 3 messages"
