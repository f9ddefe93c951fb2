"""The benchmark behind `manage.py bench` (SPEC §7): agentflow against a plain Celery chain.

Importing the package registers the bench workload (its no-op task and workflows), so bench
workers can be pointed at it with `AGENTFLOW_WORKFLOW_MODULES=agentflow.benchmark`.
"""

from __future__ import annotations

from agentflow.benchmark import workload

__all__ = ["workload"]
