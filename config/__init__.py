"""This repository's Django site: the refund service's settings, URLs, WSGI and Celery app.

The Celery app is imported here, as Celery's Django guide asks, so `@shared_task` binds to it
and `celery -A config.celery_app` finds it.
"""

from __future__ import annotations

from config.celery_app import app as celery_app

__all__ = ("celery_app",)
