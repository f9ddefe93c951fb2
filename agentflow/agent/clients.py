"""The model client protocol, and which client a run uses.

An agent workflow brings its own scripted planner; an OpenAI-compatible server replaces it
when `AGENTFLOW_LLM_BASE_URL` is set, followed by the servers of `AGENTFLOW_LLM_FALLBACKS`
when any are (`agent.fallbacks`). Either way the loop sees one small protocol.
"""

from __future__ import annotations

import importlib.util
from typing import Protocol

from django.core.exceptions import ImproperlyConfigured

from agentflow._conf import settings
from agentflow.agent.conversation import ModelRequest, ModelResponse
from agentflow.agent.fallbacks import FallbackModel, fallback_servers


class ModelClient(Protocol):
    """Answers one turn. Raises RetryableStepError (the step retries under the same key) or
    PermanentStepError (the run fails with the reason)."""

    #: The model name requests are made for; part of each turn's fingerprint.
    model: str

    def complete(self, request: ModelRequest) -> ModelResponse: ...


def configured_client(default: ModelClient) -> ModelClient:
    """The server named by `AGENTFLOW_LLM_BASE_URL` if set (then the fallbacks, in order),
    else `default` (offline)."""
    if not settings.AGENTFLOW_LLM_BASE_URL:
        return default
    # The SDK is the `agent` extra: it loads only when a server is configured.
    if importlib.util.find_spec("openai") is None:
        raise ImproperlyConfigured(
            "AGENTFLOW_LLM_BASE_URL is set, and talking to a model server needs the openai "
            "SDK: pip install 'django-agentflow[agent]'"
        )
    from agentflow.agent.openai_chat import OpenAIChatModel

    primary = OpenAIChatModel.from_settings()
    servers = fallback_servers()
    if not servers:
        return primary
    timeout = settings.AGENTFLOW_LLM_TIMEOUT_SECONDS
    chain = [
        OpenAIChatModel(
            base_url=server.base_url,
            model=server.model,
            api_key=server.api_key,
            timeout_seconds=timeout,
        )
        for server in servers
    ]
    return FallbackModel([primary, *chain])
