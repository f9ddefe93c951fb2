"""The Celery app: configuration only (settings come from Django's, under the CELERY_ prefix)."""

from __future__ import annotations

import os

from celery import Celery

from agentflow import broker  # noqa: F401  registers the embedded default's transport

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentflow.settings")

app = Celery("agentflow")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
