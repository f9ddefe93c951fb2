"""This site's Celery app, per Celery's Django guide: settings under CELERY_, tasks from every
installed app (agentflow's step task among them)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import beat_init, setup_logging, task_prerun, worker_init
from django.db import reset_queries

from config import broker  # noqa: F401  registers the embedded default's transport

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@setup_logging.connect
def _log_like_django(**kwargs: Any) -> None:
    """Worker and beat log through the same formatter as the web (AGENTFLOW_LOG_FORMAT), not
    Celery's own: a receiver here tells Celery to leave logging alone."""
    from django.conf import settings

    from agentflow import logs

    logs.configure(settings.LOGGING)


@worker_init.connect
@beat_init.connect
def _trace(**kwargs: Any) -> None:
    """The SDK, when OTEL_EXPORTER_OTLP_ENDPOINT is set: in the worker before it forks its pool
    (the SDK's exporter thread restarts in each child) and in beat."""
    from config import tracing

    tracing.configure()


@task_prerun.connect
def _forget_queries(**kwargs: Any) -> None:
    """Each task starts with an empty query log, as Django starts each request: under DEBUG a
    connection keeps every statement it ran (up to 9,000, about 1 KiB each) until a request
    starts, and a worker has none, so its pool processes grew by ~9 MiB each."""
    reset_queries()
