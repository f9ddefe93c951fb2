"""A deterministic model: its answers come from a Python function of the conversation.

The offline default (no server, no key, `make run` works anywhere) and the reference for
tests: the same conversation always gets the same answer, with the same tool call ids and the
same token figures, so a replayed run and an uninterrupted one record identical turns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentflow.agent.conversation import (
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
    assistant_message,
    message_json,
)

#: Characters per token for the estimate the scripted model reports as usage: the common rule
#: of thumb for English and JSON, close enough for turn budgets and "tokens saved" figures.
CHARS_PER_TOKEN = 4


@dataclass(frozen=True, kw_only=True)
class PlannedCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Plan:
    """One turn's answer: tool calls (run in this order), or a final text for the customer."""

    calls: tuple[PlannedCall, ...] = ()
    answer: str | None = None

    def __post_init__(self) -> None:
        if bool(self.calls) == (self.answer is not None):
            raise ValueError("a plan has either tool calls or a final answer")


def call(name: str, **arguments: Any) -> PlannedCall:
    return PlannedCall(name=name, arguments=arguments)


def calls(*planned: PlannedCall) -> Plan:
    return Plan(calls=planned)


def answer(text: str) -> Plan:
    return Plan(answer=text)


Planner = Callable[[ModelRequest], Plan]


class ScriptedModel:
    """A ModelClient whose turns come from `planner(request)`."""

    def __init__(self, model: str, planner: Planner) -> None:
        self.model = model
        self.planner = planner

    def complete(self, request: ModelRequest) -> ModelResponse:
        plan = self.planner(request)
        turn = request.turn
        tool_calls = tuple(
            ToolCall(
                id=f"call_{turn}_{index}",
                name=planned.name,
                arguments_text=message_json(planned.arguments),
            )
            for index, planned in enumerate(plan.calls, start=1)
        )
        message = assistant_message(plan.answer, tool_calls)
        prompt = estimate_tokens({"messages": list(request.messages), "tools": list(request.tools)})
        completion = estimate_tokens(message)
        return ModelResponse(
            message=message,
            finish_reason="tool_calls" if tool_calls else "stop",
            usage=Usage(
                prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
            ),
            model=request.model,
        )


def estimate_tokens(value: Any) -> int:
    """A deterministic token count for a JSON value (its JSON text's length / 4)."""
    return math.ceil(len(message_json(value)) / CHARS_PER_TOKEN)
