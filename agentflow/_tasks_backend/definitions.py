"""A `@task` as an agentflow workflow: its durable options, and the function its runs replay.

Each task function is one code workflow, `task:<module path>` version 1, whose function is
`_body`: wait for `run_after` if the enqueue gave one, then run the task as the run's one step
(claimed before it runs, an idempotency key the same on every attempt, taken over when its
worker dies), or, declared `replay=True`, replay the task function itself as a code workflow's
function, its durable calls (`context.step`, `sleep`, `wait_for`) each checkpointed.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from inspect import iscoroutinefunction
from typing import Any

from django.utils import timezone
from django.utils.module_loading import import_string

from agentflow._base import identifiers
from agentflow._base.context import StepContext, idempotency_key
from agentflow._base.retry import DEFAULT_RETRY, RetryPolicy
from agentflow._base.states import StepKind
from agentflow._core import leases
from agentflow._core.registry import NAME_MAX_CHARS
from agentflow.agent.loop import AgentContext, CodeWorkflow
from agentflow.agent.waiting import Waited
from agentflow.exceptions import AgentflowError, PartnerWait, PermanentStepError

from . import framework, results
from .calls import STEP, VERSION, Call
from .resolver import workflow_name

#: The kinds a task may declare: its one step's (an `llm` or `db` step is no task's).
KINDS = (StepKind.EFFECT, StepKind.READ)


@dataclass(frozen=True, slots=True, kw_only=True)
class DurableTask(framework.Task):  # type: ignore[misc]
    """`@task(...)` on this backend: Django's task, and the durable options Django 6.1 passes
    through `@task(**kwargs)` (the backport passes them on 5.2; Django 6.0 does not)."""

    #: "effect" (the default): claimed and committed before the function runs, so a run shows
    #: RUNNING and a worker that dies mid-task is taken over, the retry under the same key;
    #: "read": no side effect, claimed and recorded in one commit after it ran.
    kind: str = StepKind.EFFECT
    #: Attempts and back-off for `RetryableStepError` (the engine's default if None).
    retry: RetryPolicy | None = None
    #: `reconcile(context, *args, **kwargs)`: asked before an effect task runs again after its
    #: worker died (or its answer was lost): the value to adopt as its return value when the
    #: partner has it, None when it did not happen.
    reconcile: Callable[..., Any] | None = None
    #: How long the partner keeps idempotency keys (AGENTFLOW_KEY_WINDOW_SECONDS if None).
    key_window_seconds: float | None = None
    #: Replay the function as a code workflow's: its `context.step` / `sleep` / `wait_for`
    #: calls are checkpointed; code between them runs again on each replay.
    replay: bool = False


def problems(task: Any) -> list[str]:
    """Why `task` cannot run on this backend, as sentences (empty: it can)."""
    found = []
    name = workflow_name(task.module_path)
    refused = identifiers.problem("task's module path", name, max_chars=NAME_MAX_CHARS)
    if refused:
        found.append(f"{task.module_path}: {refused} (its workflow is named {name!r})")
    if not isinstance(task, DurableTask):
        return found
    where = task.module_path
    if task.kind not in KINDS:
        found.append(f"{where}: kind is 'effect' or 'read', not {task.kind!r}")
    if task.retry is not None and not isinstance(task.retry, RetryPolicy):
        found.append(f"{where}: retry is a durable.RetryPolicy(...), not {task.retry!r}")
    if task.reconcile is not None and not callable(task.reconcile):
        found.append(f"{where}: reconcile is a function, not {task.reconcile!r}")
    if task.reconcile is not None and task.kind != StepKind.EFFECT:
        found.append(f"{where}: only an 'effect' task has a partner to reconcile with")
    window = task.key_window_seconds
    if window is not None and (
        isinstance(window, bool) or not isinstance(window, int | float) or not window > 0
    ):
        found.append(f"{where}: key_window_seconds is a number of seconds above 0")
    if not isinstance(task.replay, bool):
        found.append(f"{where}: replay is True or False")
    elif task.replay:
        if task.reconcile is not None or task.kind != StepKind.EFFECT:
            found.append(
                f"{where}: a replay=True task declares kind and reconcile on its "
                "context.step(...) calls, not on @task"
            )
        if iscoroutinefunction(task.func):
            found.append(f"{where}: a replay=True task is a plain function, not async")
        if not task.takes_context:
            found.append(f"{where}: a replay=True task takes its context (takes_context=True)")
    return found


# --- the workflow of a task -------------------------------------------------------------------
_defined: dict[str, CodeWorkflow] = {}


def define(task: Any) -> CodeWorkflow:
    """The workflow of `task`'s function, defined (and registered) the first time it is seen:
    when its module is imported, in whichever process."""
    name = workflow_name(task.module_path)
    found = _defined.get(name)
    if found is None:
        retry = getattr(task, "retry", None) or DEFAULT_RETRY
        found = CodeWorkflow(name, version=VERSION, retry=retry, fn=_body(task.module_path))
        _defined[name] = found
    return found


def task_of(module_path: str) -> Any:
    """The module-level task named `module_path` (what `TaskResult.task` is)."""
    found = import_string(module_path)
    if not isinstance(found, framework.Task):
        raise ImportError(f"{module_path} is not a task")
    return found


def _body(module_path: str) -> Callable[[AgentContext], Any]:
    def body(ctx: AgentContext) -> Any:
        task = task_of(module_path)
        call = Call.from_input(ctx.input)
        if call.run_after is not None:
            ctx.sleep_until(call.run_after)  # WAITING on a timer, no worker held
        if getattr(task, "replay", False):
            return _replayed(task, call, ctx)
        outcome = ctx.step(
            STEP,
            lambda step_ctx: _attempt(task, call, step_ctx),
            kind=getattr(task, "kind", StepKind.EFFECT),
            reconcile=_reconcile(task, call),
            key_window_seconds=getattr(task, "key_window_seconds", None),
        )
        return outcome["value"]

    return body


def _attempt(task: Any, call: Call, step_ctx: StepContext) -> dict[str, Any]:
    """One attempt of the task's step: Django's signals around the task function, its return
    value made JSON as Django makes it, and the worker recorded beside it (`worker_ids`)."""
    result = results.load(task, step_ctx.run_id)
    if step_ctx.attempt == 1:  # a takeover or a retry is the same task, started once
        started = replace(
            result,
            status=framework.TaskResultStatus.RUNNING,  # a `read` task's claim is not yet seen
            started_at=result.started_at or timezone.now(),
        )
        framework.task_started.send(type(task.get_backend()), task_result=started)
    context = DurableTaskContext(task_result=result, idempotency_key=step_ctx.idempotency_key)
    try:
        if task.takes_context:
            raw = task.call(context, *call.args, **call.kwargs)
        else:
            raw = task.call(*call.args, **call.kwargs)
        value = results.normalized(raw)
    except (AgentflowError, PartnerWait):
        raise  # the engine's vocabulary: retried under the same key, waited, or failed
    except Exception as exc:
        raised = TaskRaised.of(exc)
        _finished(task, result, framework.TaskResultStatus.FAILED, errors=[raised.error])
        raise raised from exc
    _finished(task, result, framework.TaskResultStatus.SUCCESSFUL, value=value)
    return {"value": value, "worker": leases.owner_token() or ""}


def _finished(
    task: Any, result: Any, status: str, *, value: Any = None, errors: list[Any] | None = None
) -> None:
    now = timezone.now()
    ended = replace(
        result, status=status, finished_at=now, errors=[*result.errors, *(errors or [])]
    )
    object.__setattr__(ended, "_return_value", value)
    framework.task_finished.send(type(task.get_backend()), task_result=ended)


def _reconcile(task: Any, call: Call) -> Callable[[StepContext], Any] | None:
    declared = getattr(task, "reconcile", None)
    if declared is None:
        return None

    def reconcile(step_ctx: StepContext) -> Any:
        context = DurableTaskContext(
            task_result=results.load(task, step_ctx.run_id),
            idempotency_key=step_ctx.idempotency_key,
        )
        found = declared(context, *call.args, **call.kwargs)
        if found is None:
            return None
        return {"value": results.normalized(found), "worker": leases.owner_token() or ""}

    return reconcile


def _replayed(task: Any, call: Call, ctx: AgentContext) -> Any:
    context = DurableTaskContext(
        task_result=results.load(task, ctx.run_id),
        idempotency_key=idempotency_key(ctx.run_id, 0),
        calls=ctx,
    )
    return results.normalized(task.call(context, *call.args, **call.kwargs))


class TaskRaised(PermanentStepError):
    """The task function raised: the task FAILED, as Django's contract says. Its error text is
    the exception's class path, its message, then its traceback (what `TaskError` holds)."""

    def __init__(self, message: str | None = None, *, class_path: str = "", trace: str = ""):
        super().__init__(message)
        self.class_path = class_path
        self.trace = trace

    def __reduce__(self) -> Any:
        return (_raised, (str(self), self.class_path, self.trace))

    @classmethod
    def of(cls, exc: BaseException) -> TaskRaised:
        path = f"{type(exc).__module__}.{type(exc).__qualname__}"
        trace = "".join(traceback.format_exception(exc))
        return cls(results.error_text(path, str(exc), trace), class_path=path, trace=trace)

    @property
    def error(self) -> Any:
        return framework.TaskError(exception_class_path=self.class_path, traceback=self.trace)


def _raised(message: str, class_path: str, trace: str) -> TaskRaised:
    return TaskRaised(message, class_path=class_path, trace=trace)


@dataclass(frozen=True, slots=True, kw_only=True)
class DurableTaskContext(framework.TaskContext):  # type: ignore[misc]
    """What a task given `takes_context=True` receives: Django's `TaskContext` (its
    `task_result`, `attempt`) and the run's durable side."""

    #: The key to send the partner: the same on every attempt of this task (a takeover after
    #: its worker died included), different for every enqueue.
    idempotency_key: str
    _calls: AgentContext | None = field(default=None, repr=False)

    def __init__(self, *, task_result: Any, idempotency_key: str, calls: Any = None) -> None:
        object.__setattr__(self, "task_result", task_result)
        object.__setattr__(self, "idempotency_key", idempotency_key)
        object.__setattr__(self, "_calls", calls)

    def step(
        self,
        name: str,
        fn: Callable[[StepContext], Any],
        *,
        kind: str = StepKind.READ,
        arguments: Any = None,
        reconcile: Callable[[StepContext], Any] | None = None,
        key_window_seconds: float | None = None,
    ) -> Any:
        """A durable step of a `replay=True` task, exactly as `AgentContext.step`: run once
        (an effect claimed first, with its own idempotency key), its result replayed after."""
        return self._durable().step(
            name,
            fn,
            kind=kind,
            arguments=arguments,
            reconcile=reconcile,
            key_window_seconds=key_window_seconds,
        )

    def sleep(self, seconds: float) -> None:
        """Wait `seconds` (from when the run first got here), holding no worker."""
        self._durable().sleep(seconds)

    def sleep_until(self, when: datetime) -> None:
        self._durable().sleep_until(when)

    def wait_for(self, name: str, *, timeout: float | None = None) -> Waited:
        """Wait for `durable.signal(<the task result's id>, name, ...)`."""
        return self._durable().wait_for(name, timeout=timeout)

    def _durable(self) -> AgentContext:
        if self._calls is None:
            raise AgentflowError(
                "durable calls (step, sleep, wait_for) are for tasks declared "
                "@task(replay=True, takes_context=True); this task runs as one step"
            )
        return self._calls
