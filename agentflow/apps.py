"""App config: registers workflow definitions and the engine's signal receivers, nothing heavier."""

from __future__ import annotations

import importlib

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class AgentflowConfig(AppConfig):
    name = "agentflow"
    verbose_name = "Workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here, as Django asks: these modules load models and connect receivers,
        # which must wait until the app registry is ready (apps.py is imported while it fills).
        from celery.signals import before_task_publish
        from django.core.signals import setting_changed
        from django.db.backends.signals import connection_created

        from agentflow import _store as store
        from agentflow._conf import settings
        from agentflow._core import faults, outage, pooler, registry
        from agentflow._engine import checks, runtime, tasks  # noqa: F401
        from agentflow._limits import hooks as partner_limits
        from agentflow._observe import tracing
        from agentflow._schedules import hooks as schedules
        from agentflow._tasks_backend import resolver
        from agentflow.agent import checks as agent_checks  # noqa: F401
        from agentflow.agent import steps as agent_steps

        # Every process (web, worker, beat) must know every definition before it touches a run.
        autodiscover_modules("workflows")
        for module in settings.AGENTFLOW_WORKFLOW_MODULES:
            importlib.import_module(module)
        registry.validate_all()
        # Agent mode: a feature beside the core, whose runs' steps the runtime hands to it.
        runtime.serve_code_runs(agent_steps)
        # A worker handed a `@task`'s run imports the task's module if nothing did yet.
        registry.add_importer(resolver.PREFIX, resolver.import_task)
        # Features beside the core join its rounds (sweeps, retention, scrapes, checks).
        partner_limits.install()  # before the schedules: its sweep part runs first
        schedules.install()
        faults.install_clock_offset(settings.AGENTFLOW_CLOCK_OFFSET_SECONDS)
        faults.warn_if_crash_at_cannot_fire()
        # Step messages carry the run's trace context once the host installs an SDK.
        before_task_publish.connect(tracing.inject_into_step_message, weak=False)
        # Prepared statements as AGENTFLOW_DB_PREPARED_STATEMENTS says (a pooler may lose them).
        pooler.mode()  # a bad value fails at start, not at the first connection
        connection_created.connect(pooler.connection_created, weak=False)
        # A connection that opens ends the outage this process saw (said once, in its log).
        connection_created.connect(outage.connected, weak=False)
        setting_changed.connect(store.databases_changed, weak=False)
