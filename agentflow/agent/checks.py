"""Agent mode's system checks (`manage.py check`; the engine's own are
`agentflow._engine.checks`): a model server's settings that would fail an agent run's first
turn, told at deploy time."""

from __future__ import annotations

from typing import Any

from django.core import checks

from agentflow._conf import settings
from agentflow.agent.fallbacks import fallback_servers


@checks.register()
def model_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A model server without a model name would fail every agent run's first turn."""
    messages: list[checks.CheckMessage] = []
    if settings.AGENTFLOW_LLM_BASE_URL and not settings.AGENTFLOW_LLM_MODEL:
        messages.append(
            checks.Error(
                "AGENTFLOW_LLM_BASE_URL is set but AGENTFLOW_LLM_MODEL is empty.",
                hint="Name the model agent runs ask, or unset AGENTFLOW_LLM_BASE_URL.",
                id="agentflow.E001",
            )
        )
    messages.extend(_fallback_settings())
    return messages


def _fallback_settings() -> list[checks.CheckMessage]:
    """A malformed fallback list would fail the first turn whose primary is down, exactly
    when it is needed; one without a primary would never be asked."""
    try:
        servers = fallback_servers()
    except ValueError as exc:
        return [
            checks.Error(
                f"AGENTFLOW_LLM_FALLBACKS is not a list of model servers: {exc}.",
                hint='Set it to JSON like [{"base_url": "https://…/v1", "model": "…", '
                '"api_key": "…"}], or leave it empty.',
                id="agentflow.E010",
            )
        ]
    if servers and not settings.AGENTFLOW_LLM_BASE_URL:
        return [
            checks.Error(
                "AGENTFLOW_LLM_FALLBACKS is set but AGENTFLOW_LLM_BASE_URL is empty: agent "
                "runs use their scripted planners and no fallback is ever asked.",
                hint="Set AGENTFLOW_LLM_BASE_URL (the primary) and AGENTFLOW_LLM_MODEL.",
                id="agentflow.E010",
            )
        ]
    return []
