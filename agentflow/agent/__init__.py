"""Agent mode (docs/agent.md): the parts a durable LLM tool loop is built from.

Domain code imports from here: `Toolbox`/`ToolContext` to declare tools, `ScriptedModel` and
`call`/`calls`/`answer` to write an offline planner, the conversation values to read a turn.
The OpenAI-compatible client is chosen by settings (`clients.configured_client`) and imports
the SDK only when used.
"""

from __future__ import annotations

from agentflow.agent.clients import ModelClient, configured_client
from agentflow.agent.conversation import (
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolExchange,
    Usage,
    system_message,
    tool_exchanges,
    tool_result_message,
    user_message,
)
from agentflow.agent.fingerprint import CallKind, Fingerprint
from agentflow.agent.limits import AgentLimits
from agentflow.agent.scripted import Plan, PlannedCall, ScriptedModel, answer, call, calls
from agentflow.agent.tools import Toolbox, ToolContext, ToolOutcome, ToolRecord
from agentflow.exceptions import BudgetExceeded, ToolRefused

__all__ = [
    "AgentLimits",
    "BudgetExceeded",
    "CallKind",
    "Fingerprint",
    "Message",
    "ModelClient",
    "ModelRequest",
    "ModelResponse",
    "Plan",
    "PlannedCall",
    "ScriptedModel",
    "ToolCall",
    "ToolContext",
    "ToolExchange",
    "ToolOutcome",
    "ToolRecord",
    "ToolRefused",
    "Toolbox",
    "Usage",
    "answer",
    "call",
    "calls",
    "configured_client",
    "system_message",
    "tool_exchanges",
    "tool_result_message",
    "user_message",
]
