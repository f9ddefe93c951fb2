"""Discovered at start-up (`autodiscover_modules("workflows")`): registers the bench workload."""

from __future__ import annotations

from config.bench import agent_scale, partner_limit, workload

__all__ = ["agent_scale", "partner_limit", "workload"]
