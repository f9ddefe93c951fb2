"""agentflow as Django's tasks backend (docs/tasks-backend.md)::

    TASKS = {"default": {"BACKEND": "agentflow.tasks_backend.DurableTaskBackend"}}

Plain `@task` functions then run as durable agentflow runs on the project's Celery workers.
Needs Django 6.0 or newer, or on Django 5.2 the `django-tasks` backport (the `tasks` extra);
the rest of agentflow imports without either.
"""

from __future__ import annotations

from agentflow._tasks_backend.backend import DurableTaskBackend
from agentflow._tasks_backend.definitions import DurableTask, DurableTaskContext, TaskRaised

__all__ = ["DurableTask", "DurableTaskBackend", "DurableTaskContext", "TaskRaised"]
