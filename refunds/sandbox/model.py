"""The model partner: an OpenAI-compatible chat-completions endpoint that answers as the
refund agent's scripted planner would, so agent runs under chaos talk to a model over HTTP
through the real `openai` SDK, and the sandbox counts every request they make (model turns
asked again after a crash show up as requests beyond the turns recorded)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from agentflow.agent import ModelRequest, ScriptedModel
from refunds.agent.planner import plan_refund
from refunds.sandbox.messages import Invalid, Request, Response


def error(status: int, message: str = "") -> Response:
    kind = "rate_limit_error" if status == 429 else "server_error" if status >= 500 else "invalid"
    body = {"error": {"message": message or f"Injected sandbox fault ({status}).", "type": kind}}
    return Response(status=status, body=body)


def chat_completion(request: Request) -> Response:
    """`POST /v1/chat/completions` (non-streaming, with tool calls and usage)."""
    try:
        body = request.json()
        messages = tuple(body["messages"])
        model = str(body.get("model") or "scripted")
    except (KeyError, TypeError, ValueError):
        raise Invalid(error(400, "a chat completion needs a JSON body with messages")) from None
    turn = ModelRequest(model=model, messages=messages, tools=tuple(body.get("tools") or ()))
    try:
        answer = ScriptedModel(model, plan_refund).complete(turn)
    except (KeyError, StopIteration, ValueError) as exc:
        raise Invalid(error(400, f"the planner could not read this conversation: {exc}")) from None
    return Response(status=200, body=_completion(answer.as_json(), turn))


def _completion(answer: dict[str, Any], turn: ModelRequest) -> dict[str, Any]:
    """The chat-completions response object for one answer (its id fixed by the conversation,
    so the same turn asked again reads the same)."""
    digest = hashlib.sha256(json.dumps(list(turn.messages), sort_keys=True).encode()).hexdigest()
    return {
        "id": f"chatcmpl-{digest[:24]}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": answer["model"],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **answer["message"]},
                "finish_reason": answer["finish_reason"],
                "logprobs": None,
            }
        ],
        "usage": answer["usage"],
    }
