"""The Celery app: configuration only (settings come from Django's, under the CELERY_ prefix)."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import setup_logging

from agentflow import broker  # noqa: F401  registers the embedded default's transport

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentflow.settings")

app = Celery("agentflow")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@setup_logging.connect
def _log_like_django(**kwargs: Any) -> None:
    """Worker and beat log through the same formatter as the web (AGENTFLOW_LOG_FORMAT), not
    Celery's own: a receiver here tells Celery to leave logging alone."""
    from django.conf import settings

    from agentflow import logs

    logs.configure(settings.LOGGING)
