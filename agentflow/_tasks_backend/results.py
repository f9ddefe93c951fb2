"""A task's `TaskResult`, read from its run's rows: the same answer from any process.

Status, from the run and its checkpoints (docs/tasks-backend.md, "What each `TaskResult` field
means"):
READY until the task's step is claimed, and again while it waits to be tried again; RUNNING
while it is claimed (or, replayed, between its calls, and while parked for an operator);
SUCCESSFUL once the run completed; FAILED once it failed or was cancelled.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Q

from agentflow._base.states import RunStatus, StepStatus
from agentflow._core.serialization import storable_text
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun

from . import framework
from .calls import STEP, Call
from .resolver import PREFIX

#: Result ids are run ids; Django says an id is at most this long.
RESULT_ID_MAX_CHARS = 64
#: The worker of an attempt the rows do not name (one that failed and was tried again).
UNNAMED_WORKER = "unknown"


def error_text(class_path: str, message: str, trace: str) -> str:
    """How a task's exception is recorded as its step's error: the class path and message on
    the first line (what the console shows), then the traceback."""
    return f"{class_path}: {message}\n{trace}".rstrip()


def normalized(value: Any) -> Any:
    """A task's return value (or arguments) as Django stores them: JSON types, tuples as lists,
    bytes as text. Raises TypeError or ValueError for anything else, as Django does."""
    return framework.normalize_json(value)


def load(task: Any, result_id: str) -> Any:
    """The result of `task`'s run `result_id` as its rows say now."""
    run = WorkflowRun.objects.filter(pk=result_id).first()
    if run is None:
        raise framework.TaskResultDoesNotExist(result_id)
    return of_run(run, task)


def find(result_id: object) -> WorkflowRun:
    """The run of a task result id, or TaskResultDoesNotExist: for an id that is no run of a
    task, as for one that names nothing."""
    if (
        not isinstance(result_id, str)
        or not result_id
        or len(result_id) > RESULT_ID_MAX_CHARS
        or not storable_text(result_id)
    ):
        raise framework.TaskResultDoesNotExist(result_id)
    run = WorkflowRun.objects.filter(pk=result_id, workflow__startswith=PREFIX).first()
    if run is None:
        raise framework.TaskResultDoesNotExist(result_id)
    return run


def of_run(run: WorkflowRun, task: Any) -> Any:
    call = Call.from_input(run.input)
    steps = list(
        StepCheckpoint.objects.filter(run=run, seq__gte=call.first_position).order_by("seq")
    )
    events = list(
        RunEvent.objects.filter(
            Q(kind=RunEvent.Kind.TAKEOVER) | Q(kind=RunEvent.Kind.ATTEMPT_FAILED),
            run=run,
            seq__gte=call.first_position,
        ).order_by("at", "id")
    )
    finished = run.status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
    result = framework.TaskResult(
        task=task,
        id=run.id,
        status=_status(run, steps),
        enqueued_at=run.created_at,
        started_at=steps[0].first_started_at if steps else None,
        last_attempted_at=max((cp.started_at for cp in steps), default=None),
        finished_at=run.updated_at if finished else None,
        args=call.args,
        kwargs=call.kwargs,
        backend=task.backend,
        errors=_errors(run, steps, events),
        worker_ids=_workers([cp for cp in steps if cp.name == STEP], events),
    )
    if run.status == RunStatus.COMPLETED:
        object.__setattr__(result, "_return_value", run.output)
    return result


def _status(run: WorkflowRun, steps: list[StepCheckpoint]) -> str:
    statuses = framework.TaskResultStatus
    if run.status == RunStatus.COMPLETED:
        return statuses.SUCCESSFUL
    if run.status in (RunStatus.FAILED, RunStatus.CANCELLED):
        return statuses.FAILED
    if not steps:
        return statuses.READY  # enqueued, or waiting for its run_after
    last = steps[-1]
    if last.status == StepStatus.FAILED and last.retryable:
        return statuses.READY  # "ready to be executed again", as Django defines it
    return statuses.RUNNING


def _errors(run: WorkflowRun, steps: list[StepCheckpoint], events: list[RunEvent]) -> list[Any]:
    """Each failed attempt's error (an event keeps its first 1,000 characters; the latest is
    read whole from its checkpoint), or the run's own for a run that ended without one."""
    texts = [
        str((event.data or {}).get("error") or event.detail)
        for event in events
        if event.kind == RunEvent.Kind.ATTEMPT_FAILED
    ]
    last = steps[-1] if steps else None
    if texts and last is not None and last.status == StepStatus.FAILED and last.error:
        texts[-1] = last.error
    if not texts and run.status in (RunStatus.FAILED, RunStatus.CANCELLED) and run.error:
        texts.append(run.error)
    return [_error(text) for text in texts]


def _error(text: str) -> Any:
    """A `TaskError` from a recorded error: the class path a task's own exception recorded
    first (see `error_text`), else the engine's error for the failure it recorded."""
    first, _, _ = text.partition("\n")
    path, sep, _ = first.partition(": ")
    if not (sep and "." in path and " " not in path):
        path = "agentflow.exceptions.PermanentStepError"
    return framework.TaskError(exception_class_path=path, traceback=text)


def _workers(steps: list[StepCheckpoint], events: list[RunEvent]) -> list[str]:
    """One worker id per attempt of the task's step: the owners a takeover names, the one
    holding it now or the one that completed it, `UNNAMED_WORKER` for the rest."""
    if not steps:
        return []
    step = steps[0]
    named = [
        str(((event.data or {}).get("previous") or {}).get("owner") or UNNAMED_WORKER)
        for event in events
        if event.kind == RunEvent.Kind.TAKEOVER and event.seq == step.seq
    ]
    if step.status == StepStatus.IN_PROGRESS and step.lease_owner:
        named.append(step.lease_owner)
    elif step.status == StepStatus.COMPLETED and isinstance(step.output, dict):
        named.append(str(step.output.get("worker") or UNNAMED_WORKER))
    missing = max(step.attempts - len(named), 0)
    return [UNNAMED_WORKER] * missing + named
