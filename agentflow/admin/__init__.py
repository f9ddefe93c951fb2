"""The operator's Django admin for workflow runs, registered when admin autodiscovery imports it."""

from __future__ import annotations

from agentflow.admin.runs import WorkflowRunAdmin

__all__ = ["WorkflowRunAdmin"]
