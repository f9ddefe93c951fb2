"""`DurableTaskBackend`: Django's tasks framework, each enqueue an agentflow run.

An enqueue is `durable.start` inside the caller's transaction: the run's row commits or rolls
back with the caller's rows, its first message is published on commit, and the sweeper
publishes it again if the process died between the commit and the publish. A result is read
from the run's rows, so any process gets the same one.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.core import checks
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import module_has_submodule

from agentflow import durable

from . import definitions, framework, results
from .resolver import PREFIX

#: Task problems: one for a task whose definition this backend refuses, one for QUEUES.
CHECK_TASK = "agentflow.E040"
CHECK_QUEUES = "agentflow.E042"


class DurableTaskBackend(framework.BaseTaskBackend):  # type: ignore[misc]
    """`TASKS = {"default": {"BACKEND": "agentflow.tasks_backend.DurableTaskBackend"}}`."""

    task_class = definitions.DurableTask
    #: `run_after`: the run waits on a durable timer, holding no worker.
    supports_defer = True
    #: An async task function runs to its end in the worker (`Task.call`), as one step.
    supports_async_task = True
    #: From any process: the result is the run's rows.
    supports_get_result = True
    #: A task's priority (-100 to 100) becomes its run's (0 to 9, `run_priority`).
    supports_priority = True

    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        found = definitions.problems(task)
        if found:
            raise framework.InvalidTask("; ".join(found))
        definitions.define(task)

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        """Start the task's run in the caller's transaction; `task_enqueued` once it commits."""
        self.validate_task(task)
        call = definitions.Call(
            args=results.normalized(list(args)),
            kwargs=results.normalized(dict(kwargs)),
            run_after=_after(task.run_after),
        )
        run_id = durable.start(
            definitions.define(task).name,
            input=call.as_input(),
            priority=run_priority(task.priority),
        )
        result = results.load(task, run_id)
        sender = type(self)
        transaction.on_commit(
            lambda: framework.task_enqueued.send(sender, task_result=result), robust=True
        )
        return result

    def get_result(self, result_id: str) -> Any:
        """The task result `result_id` as its run's rows say now; TaskResultDoesNotExist for an
        id that names no task's run. Anyone holding an id can read it: bind results to their
        owners where a view hands them out (docs/tasks-backend.md)."""
        run = results.find(result_id)
        path = run.workflow.removeprefix(PREFIX)
        try:
            task = definitions.task_of(path)
        except ImportError:
            raise framework.TaskResultDoesNotExist(
                f"{result_id}: its task {path} is not in this code any more"
            ) from None
        return results.of_run(run, task)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """What `manage.py check` says of this backend: QUEUES it cannot honour, and every
        task of the installed apps' `tasks` modules whose durable options it refuses."""
        yield from super().check(**kwargs)
        if self.queues and self.queues != {framework.DEFAULT_TASK_QUEUE_NAME}:
            yield checks.Error(
                f"TASKS[{self.alias!r}] QUEUES is {sorted(self.queues)}: agentflow runs every "
                "task on its workers' step queue",
                hint=f'Leave QUEUES out, or make it ["{framework.DEFAULT_TASK_QUEUE_NAME}"].',
                id=CHECK_QUEUES,
            )
        for module, problem in _task_modules():
            yield checks.Error(
                f"{module}: {problem}",
                hint="See the durable options in docs/tasks-backend.md.",
                id=CHECK_TASK,
            )


def run_priority(task_priority: int) -> int | None:
    """A task's priority on a run's scale (docs/tasks-backend.md, "Priorities"): Django's
    default 0 leaves the run to its workflow's and the site's default, as a plain start does;
    any other value from -100 to 100 is spread over 0 to 9 in order (-100 is 0, 100 is 9)."""
    if task_priority == framework.DEFAULT_TASK_PRIORITY:
        return None
    low, high = framework.TASK_MIN_PRIORITY, framework.TASK_MAX_PRIORITY
    return round((task_priority - low) * 9 / (high - low))


def _after(run_after: datetime | timedelta | None) -> datetime | None:
    if isinstance(run_after, timedelta):
        return timezone.now() + run_after
    return run_after


def _task_modules() -> Iterable[tuple[str, str]]:
    """Import each installed app's `tasks` module (as Celery's autodiscovery does): the
    refusals their `@task` definitions raise."""
    for config in apps.get_app_configs():
        if not module_has_submodule(config.module, "tasks"):
            continue
        name = f"{config.name}.tasks"
        try:
            __import__(name)
        except framework.InvalidTask as exc:
            yield name, str(exc)
