"""System checks (`manage.py check`): settings that work but leave something unreachable, told
once at deploy time rather than found out from an empty dashboard."""

from __future__ import annotations

from typing import Any

from django.core import checks

from agentflow import metrics


@checks.register(checks.Tags.security)
def metrics_access(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """With DEBUG off, /metrics wants AGENTFLOW_METRICS_TOKEN unless it is said to be public."""
    if not metrics.closed():
        return []
    return [
        checks.Warning(
            "/metrics answers 404: DEBUG is off and neither AGENTFLOW_METRICS_TOKEN nor "
            "AGENTFLOW_METRICS_PUBLIC is set.",
            hint="Set AGENTFLOW_METRICS_TOKEN and give the scraper the bearer token, or "
            "AGENTFLOW_METRICS_PUBLIC=1 where only a private network reaches /metrics.",
            id="agentflow.W001",
        )
    ]
