"""Finding a task's workflow in a process that has not imported the task's module yet.

A run of a `@task` is a run of workflow `task:<module path>`. A worker handed its step may not
have imported that module (Celery's autodiscovery imports `tasks.py` modules, a task may live
anywhere): the registry asks here, and importing the task defines its workflow. Imports nothing
of the tasks framework, so the engine loads it whether or not one is installed.
"""

from __future__ import annotations

import logging

from django.utils.module_loading import import_string

logger = logging.getLogger(__name__)

#: A task's workflow is named this, then the task function's module path.
PREFIX = "task:"


def workflow_name(module_path: str) -> str:
    return f"{PREFIX}{module_path}"


def import_task(name: str) -> None:
    """Import the task a `task:` workflow name names (defining its workflow); a log line, not
    an error, for a task that is gone: the run then waits as any run of an unknown definition
    does."""
    try:
        import_string(name.removeprefix(PREFIX))
    except ImportError as exc:
        logger.warning("task %s cannot be imported here: %s", name.removeprefix(PREFIX), exc)
