"""Run-level writes off the hot path: create, park, events, failure, operator actions (ORM)."""

from __future__ import annotations

import contextlib
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from agentflow import dispatch, telemetry
from agentflow.context import idempotency_key
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.registry import StepDef, Workflow
from agentflow.states import ACTIVE_RUN_STATUSES, RunStatus, StepKind, StepStatus

if TYPE_CHECKING:
    from collections.abc import Sequence

logger = logging.getLogger(__name__)


class RunLike(Protocol):
    """What the failure path needs of a run: a model instance or the hot path's StepState."""

    @property
    def id(self) -> str: ...
    @property
    def error(self) -> str: ...
    @property
    def compensations(self) -> Sequence[str]: ...


class Fenced(Exception):
    """Raised inside a transaction to roll it back: someone else owns this step or run now."""


class ActionRefused(Exception):
    """The run is not in a state where this action is safe."""


def enqueue_grace() -> timedelta:
    """How long a queued step may wait for a worker before the sweeper publishes it again."""
    return timedelta(seconds=settings.AGENTFLOW_LEASE_SECONDS)


def run_create(*, workflow: Workflow, input: Any, business_key: str | None) -> tuple[str, bool]:
    """Create a run (or find the one with this business key) and publish its first step."""
    if business_key is not None:
        existing = _run_id_by_key(workflow.name, business_key)
        if existing:
            return existing, False
    now = timezone.now()
    # Inside the caller's transaction a savepoint keeps a lost business-key race from aborting
    # it; alone, the INSERT is its own commit: one round trip instead of BEGIN/INSERT/COMMIT.
    own = transaction.atomic() if connection.in_atomic_block else contextlib.nullcontext()
    try:
        with own:
            run = WorkflowRun.objects.create(
                workflow=workflow.name,
                version=workflow.version,
                input=input,
                business_key=business_key,
                status=RunStatus.PENDING,
                current_step=workflow.first_step(),
                current_seq=1,
                wake_at=now + enqueue_grace(),
            )
            hint = dispatch.fresh_hint(workflow, run.current_step)
            dispatch.send_step_on_commit(run.id, 1, fresh=hint)
    except IntegrityError:
        if business_key is None:
            raise
        existing = _run_id_by_key(workflow.name, business_key)
        if existing is None:
            raise
        return existing, False
    return run.id, True


def _run_id_by_key(workflow: str, business_key: str) -> str | None:
    return (
        WorkflowRun.objects.filter(workflow=workflow, business_key=business_key)
        .values_list("id", flat=True)
        .first()
    )


def outputs_load(run_id: str, before_seq: int) -> dict[str, Any]:
    rows = (
        StepCheckpoint.objects.filter(
            run_id=run_id, seq__lt=before_seq, status=StepStatus.COMPLETED
        )
        .order_by("seq")
        .values_list("name", "output")
    )
    return dict(rows)


def event_add(run_id: str, kind: str, detail: str, *, actor: str = "engine") -> None:
    RunEvent.objects.create(run_id=run_id, kind=kind, actor=actor, detail=detail)
    telemetry.event_recorded(run_id, kind)


def run_park(run_id: str, reason: str, *, kind: str = RunEvent.Kind.NEEDS_ATTENTION) -> None:
    """Stop an active run for an operator, with the reason on the run and in an event."""
    with transaction.atomic():
        moved = WorkflowRun.objects.filter(pk=run_id, status__in=ACTIVE_RUN_STATUSES).update(
            status=RunStatus.NEEDS_ATTENTION, error=reason, wake_at=None, updated_at=timezone.now()
        )
        if moved:
            RunEvent.objects.create(run_id=run_id, kind=kind, actor="engine", detail=reason)
    if moved:
        logger.warning("run %s needs attention: %s", run_id, reason)


def step_fail(
    run: RunLike,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    *,
    attempt: int,
    claimed: bool,
    error: str,
    retry_in_seconds: float | None,
) -> None:
    """Record a failed attempt. With `retry_in_seconds` the run waits and retries under the
    same key; without it the run fails for good, compensating first if it took effects."""
    now = timezone.now()
    cp_filter: dict[str, Any] = {"run_id": run.id, "seq": seq}
    if claimed:
        cp_filter.update(status=StepStatus.IN_PROGRESS, attempts=attempt)
    cp_changes: dict[str, Any] = {
        "status": StepStatus.FAILED,
        "error": error[:4000],
        "retryable": retry_in_seconds is not None,
        "lease_expires_at": None,
        "lease_owner": "",
        "finished_at": now,
    }
    try:
        with transaction.atomic():
            if claimed:
                if not StepCheckpoint.objects.filter(**cp_filter).update(**cp_changes):
                    raise Fenced
            else:
                _, created = StepCheckpoint.objects.get_or_create(
                    **cp_filter,
                    defaults={
                        **cp_changes,
                        "name": step.name,
                        "kind": step.kind,
                        "attempts": attempt,
                        "idempotency_key": idempotency_key(run.id, seq),
                        "first_started_at": now,
                        "started_at": now,
                    },
                )
                if not created:
                    StepCheckpoint.objects.filter(**cp_filter, status=StepStatus.FAILED).exclude(
                        attempts__gte=attempt
                    ).update(attempts=attempt, **cp_changes)
            if retry_in_seconds is not None:
                _wait_txn(run, seq, now, retry_in_seconds)
            else:
                _fail_run_txn(run, workflow, step, seq, error, now)
    except Fenced:
        logger.info("failure of %s step %s was fenced out", run.id, seq)


def attempt_lost(run_id: str, step: StepDef, seq: int, seen: Any) -> None:
    """Count an attempt of a `read` or `db` step whose worker died mid-step (its message came
    back). Those steps write nothing before they finish, so without this a step that kills its
    worker every time would be redelivered for ever; counted, it meets the retry bound."""
    now = timezone.now()
    lost = {
        "status": StepStatus.FAILED,
        "retryable": True,
        "error": "the worker died while running this step",
        "finished_at": now,
    }
    if seen is None:
        with contextlib.suppress(IntegrityError), transaction.atomic():
            StepCheckpoint.objects.create(
                run_id=run_id,
                seq=seq,
                name=step.name,
                kind=step.kind,
                attempts=1,
                idempotency_key=idempotency_key(run_id, seq),
                first_started_at=now,
                started_at=now,
                **lost,
            )
        return
    StepCheckpoint.objects.filter(pk=seen.id, status=seen.status, attempts=seen.attempts).exclude(
        status=StepStatus.COMPLETED
    ).update(attempts=seen.attempts + 1, **lost)


def _wait_txn(run: RunLike, seq: int, now: datetime, delay: float) -> None:
    countdown = delay if delay <= dispatch.MAX_COUNTDOWN_SECONDS else None
    # Always the retry time plus the enqueue grace: the runtime drops any message before the
    # retry time as an early duplicate, and the sweeper steps in only if the retry is lost.
    wake_at = now + timedelta(seconds=delay) + enqueue_grace()
    moved = WorkflowRun.objects.filter(
        pk=run.id, current_seq=seq, status__in=ACTIVE_RUN_STATUSES
    ).update(status=RunStatus.WAITING, wake_at=wake_at, updated_at=now)
    if not moved:
        raise Fenced
    if countdown is not None:
        dispatch.send_step_on_commit(run.id, seq, countdown=countdown)


def _fail_run_txn(
    run: RunLike, workflow: Workflow, step: StepDef, seq: int, error: str, now: datetime
) -> None:
    reason = f"{step.name}: {error}"
    active = WorkflowRun.objects.filter(pk=run.id, current_seq=seq, status__in=ACTIVE_RUN_STATUSES)
    if step.compensation_only:
        # Undoing failed too: nothing safe is left to try without a human.
        if not active.update(
            status=RunStatus.NEEDS_ATTENTION,
            error=f"compensation failed: {reason} (after: {run.error})",
            wake_at=None,
            updated_at=now,
        ):
            raise Fenced
        RunEvent.objects.create(
            run_id=run.id, kind=RunEvent.Kind.NEEDS_ATTENTION, actor="engine", detail=reason
        )
        return
    plan = compensation_plan(run.id, workflow, seq)
    if not plan:
        if not active.update(status=RunStatus.FAILED, error=reason, wake_at=None, updated_at=now):
            raise Fenced
        telemetry.run_finished(run.id, workflow.name, RunStatus.FAILED)
        return
    if not active.update(
        status=RunStatus.RUNNING,
        error=reason,
        current_step=plan[0],
        current_seq=seq + 1,
        compensations=plan[1:],
        wake_at=now + enqueue_grace(),
        updated_at=now,
    ):
        raise Fenced
    RunEvent.objects.create(
        run_id=run.id,
        kind=RunEvent.Kind.COMPENSATION,
        actor="engine",
        detail=f"{reason}; undoing with {', '.join(plan)}",
    )
    dispatch.send_step_on_commit(run.id, seq + 1, fresh=dispatch.fresh_hint(workflow, plan[0]))


def compensation_plan(run_id: str, workflow: Workflow, before_seq: int) -> list[str]:
    """Compensation steps for the completed effects before `before_seq`, latest first, then
    the workflow's `on_failure` step."""
    done = StepCheckpoint.objects.filter(
        run_id=run_id, seq__lt=before_seq, status=StepStatus.COMPLETED
    ).order_by("-seq")
    plan = []
    for name in done.values_list("name", flat=True):
        step = workflow.steps.get(name)
        if step is not None and step.compensate and step.kind == StepKind.EFFECT:
            plan.append(step.compensate)
    if workflow.on_failure:
        plan.append(workflow.on_failure)
    return plan


def run_retry(run_id: str, *, actor: str, reason: str) -> None:
    """Resume a parked or failed run at the step where it stopped, with a fresh retry budget.

    A run that already compensated is refused: its effects were undone, so resuming would
    leave the customer half-served.
    """
    now = timezone.now()
    with transaction.atomic():
        run = WorkflowRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            raise ActionRefused("no such run")
        if run.status not in (RunStatus.NEEDS_ATTENTION, RunStatus.FAILED):
            raise ActionRefused(
                f"only failed or parked runs can be retried (this one is {run.status})"
            )
        if (
            run.status == RunStatus.FAILED
            and RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.COMPENSATION).exists()
        ):
            raise ActionRefused(
                "this run was compensated (its effects were undone); start a new one"
            )
        StepCheckpoint.objects.filter(
            run_id=run_id, seq=run.current_seq, status=StepStatus.FAILED
        ).update(retryable=True, attempts=0)
        StepCheckpoint.objects.filter(
            run_id=run_id, seq=run.current_seq, status=StepStatus.IN_PROGRESS
        ).update(lease_expires_at=now, attempts=0)
        WorkflowRun.objects.filter(pk=run_id).update(
            status=RunStatus.RUNNING, error="", wake_at=now + enqueue_grace(), updated_at=now
        )
        event_add(run_id, RunEvent.Kind.OPERATOR_RETRY, reason or "(no reason given)", actor=actor)
        dispatch.send_step_on_commit(run_id, run.current_seq)


def run_cancel(run_id: str, *, actor: str, reason: str) -> None:
    """Stop a run that has not finished. Effects already made stay made (no compensation)."""
    now = timezone.now()
    with transaction.atomic():
        moved = WorkflowRun.objects.filter(
            pk=run_id, status__in=(*ACTIVE_RUN_STATUSES, RunStatus.NEEDS_ATTENTION)
        ).update(status=RunStatus.CANCELLED, wake_at=None, updated_at=now)
        if not moved:
            raise ActionRefused("only unfinished runs can be cancelled")
        workflow = WorkflowRun.objects.filter(pk=run_id).values_list("workflow", flat=True).get()
        telemetry.run_finished(run_id, workflow, RunStatus.CANCELLED)
        event_add(run_id, RunEvent.Kind.OPERATOR_CANCEL, reason or "(no reason given)", actor=actor)
