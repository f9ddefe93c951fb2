"""The values a model turn is made of: messages, tool calls, requests, responses, token usage.

Everything here is a plain JSON value or converts to one, because a model turn is checkpointed
and replayed: what a worker stored before a crash is what the next worker must hand back.
Messages use the OpenAI chat-completions format, which every compatible server speaks.
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentflow._base.canonical import readable_json

Message = dict[str, Any]

#: The GenAI provider name (OpenTelemetry's) of any OpenAI-compatible server: they speak
#: OpenAI's API, and the official OpenAI instrumentation names them so too.
OPENAI_PROVIDER = "openai"

#: The decoder's parser itself (C where the interpreter has it), without `json.loads` around it.
_scan: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]
_JSON_SPACE = " \t\n\r"


def _parsed(text: str) -> Any:
    """`json.loads(text)` without its wrappers, which cost a replay more than parsing a
    call's arguments does.

    Raises:
        ValueError: `text` is not one JSON value.
    """
    text = text.strip(_JSON_SPACE)
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        raise ValueError("not JSON") from None
    if end != len(text):
        raise ValueError("not one JSON value")
    return value


def message_json(value: Any) -> str:
    """Deterministic JSON text for message contents (a tool's result, a call's arguments):
    sorted keys and numbers by value, like canonical JSON, but readable non-ASCII text."""
    return readable_json(value)


def system_message(text: str) -> Message:
    return {"role": "system", "content": text}


def user_message(text: str) -> Message:
    return {"role": "user", "content": text}


def tool_result_message(call_id: str, result: Any) -> Message:
    """The answer to one tool call, as the model reads it (its content is JSON text)."""
    return {"role": "tool", "tool_call_id": call_id, "content": message_json(result)}


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One tool the model asked for. `arguments_text` is exactly what it sent."""

    id: str
    name: str
    arguments_text: str

    @property
    def arguments(self) -> Any:
        """The arguments as a JSON value; text that is not JSON stays text (the registry then
        tells the model so, and that refusal is recorded like any result)."""
        try:
            return _parsed(self.arguments_text)
        except ValueError:
            return self.arguments_text

    @property
    def arguments_are_json(self) -> bool:
        try:
            _parsed(self.arguments_text)
        except ValueError:
            return False
        return True

    def as_message_part(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments_text},
        }

    @classmethod
    def from_message_part(cls, part: dict[str, Any]) -> ToolCall:
        function = part["function"]
        return cls(id=part["id"], name=function["name"], arguments_text=function["arguments"])


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Tokens one turn cost, as the server reported them (zero when it reports none)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def as_json(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Usage:
        data = data or {}
        prompt = int(data.get("prompt_tokens") or 0)
        completion = int(data.get("completion_tokens") or 0)
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=int(data.get("total_tokens") or prompt + completion),
        )


@dataclass(frozen=True, kw_only=True)
class ModelRequest:
    """What one turn asks: the model, the whole conversation so far, the tools on offer."""

    model: str
    messages: tuple[Message, ...]
    tools: tuple[dict[str, Any], ...] = ()
    #: The most output tokens the answer may have (sent as `max_tokens`): what bounds the
    #: request's cost when its answer is lost (`agentflow.agent.budget`). None: the server's.
    max_tokens: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "messages": list(self.messages), "tools": list(self.tools)}

    @property
    def turn(self) -> int:
        """This request's turn number: 1 + the assistant messages already in the conversation."""
        return 1 + sum(1 for message in self.messages if message.get("role") == "assistant")


@dataclass(frozen=True, kw_only=True)
class ModelResponse:
    """One turn's answer. `message` goes back into the conversation exactly as recorded."""

    message: Message
    #: "tool_calls", "stop", "length", "content_filter": as the server said.
    finish_reason: str
    usage: Usage
    #: The model that answered, as the server named it.
    model: str
    #: Who answered: the provider's name in OpenTelemetry's GenAI terms ("openai" for any
    #: OpenAI-compatible server) and the server's base URL; empty for an offline planner.
    provider: str = ""
    server: str = ""

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The calls in the order the model listed them: they run at consecutive positions."""
        return tuple(ToolCall.from_message_part(p) for p in self.message.get("tool_calls") or ())

    @property
    def text(self) -> str:
        return self.message.get("content") or ""

    @property
    def is_final(self) -> bool:
        """An answer without tool calls ends the agent's loop."""
        return not self.message.get("tool_calls")

    def as_json(self) -> dict[str, Any]:
        answered: dict[str, Any] = {
            "message": self.message,
            "finish_reason": self.finish_reason,
            "usage": self.usage.as_json(),
            "model": self.model,
        }
        if self.provider:
            answered["provider"] = self.provider
        if self.server:
            answered["server"] = self.server
        return answered

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelResponse:
        return cls(
            message=data["message"],
            finish_reason=data["finish_reason"],
            usage=Usage.from_json(data.get("usage")),
            model=data["model"],
            provider=str(data.get("provider") or ""),
            server=str(data.get("server") or ""),
        )


def assistant_message(text: str | None, calls: tuple[ToolCall, ...] = ()) -> Message:
    message: Message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [call.as_message_part() for call in calls]
    return message


@dataclass(frozen=True, kw_only=True)
class ToolExchange:
    """A tool call found in a conversation, with the result given back for it (if any yet)."""

    call: ToolCall
    result: Any
    answered: bool


def tool_exchanges(messages: tuple[Message, ...] | list[Message]) -> list[ToolExchange]:
    """Every tool call of the conversation in order, paired with its result by call id.

    Results are parsed back from their JSON text; a planner reads them to decide what next.
    """
    results: dict[str, Any] = {}
    for message in messages:
        if message.get("role") == "tool":
            content = message.get("content") or ""
            try:
                results[message["tool_call_id"]] = json.loads(content)
            except ValueError:
                results[message["tool_call_id"]] = content
    exchanges = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        for part in message.get("tool_calls") or ():
            call = ToolCall.from_message_part(part)
            exchanges.append(
                ToolExchange(call=call, result=results.get(call.id), answered=call.id in results)
            )
    return exchanges
