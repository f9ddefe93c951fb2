"""App config: registers workflow definitions, nothing heavier."""

from __future__ import annotations

import importlib

from django.apps import AppConfig
from django.conf import settings
from django.utils.module_loading import autodiscover_modules


class AgentflowConfig(AppConfig):
    name = "agentflow"
    verbose_name = "Workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every process (web, worker, beat) must know every definition before it touches a run.
        autodiscover_modules("workflows")
        for module in settings.AGENTFLOW_WORKFLOW_MODULES:
            importlib.import_module(module)
        from agentflow import checks, faults, registry, tracing  # noqa: F401 (checks registers)

        registry.validate_all()
        faults.install_clock_offset(settings.AGENTFLOW_CLOCK_OFFSET_SECONDS)
        faults.warn_if_crash_at_cannot_fire()
        tracing.configure()  # a no-op unless OTEL_EXPORTER_OTLP_ENDPOINT is set
