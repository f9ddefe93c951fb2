"""Discovered at start-up (`autodiscover_modules("workflows")`): registers the bench workload."""

from __future__ import annotations

from agentflow.contrib.bench import workload

__all__ = ["workload"]
