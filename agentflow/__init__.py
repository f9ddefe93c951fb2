"""agentflow: the Django project package and the durable workflow engine app.

Only the Celery app is exposed here; models are never imported at package level because the
settings module lives in this same package.
"""

from __future__ import annotations

from agentflow.celery import app as celery_app

__all__ = ["celery_app"]
