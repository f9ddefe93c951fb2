"""Run-level writes off the hot path: create, park, fail, compensate.

Every write here is fenced like the hot path's: on the run still being active at the step, and
on the checkpoint's fence number, so a worker whose claim was taken over cannot park, fail or
compensate a run that has moved on (I5).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Protocol

from django.db import IntegrityError, connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper
from django.db.models.functions import Now

from agentflow._base import outcomes
from agentflow._base.context import idempotency_key
from agentflow._base.states import RunStatus, StepKind, StepStatus
from agentflow._concurrency import reason, token
from agentflow._conf import settings
from agentflow._core import builds, dispatch
from agentflow._core.registry import StepDef, Workflow
from agentflow._observe import telemetry
from agentflow._store import sql
from agentflow._store.builds import build_known
from agentflow._store.concurrency import (
    WAIT_WAKE_SECONDS,
    concurrency_admit_new,
    concurrency_held,
    concurrency_run_ended,
)
from agentflow._store.events import event_add, event_time
from agentflow._store.parents import run_ended
from agentflow._store.sensitive import masked
from agentflow._store.steps import ACTIVE, CheckpointRow, Claim, state_load
from agentflow.models import RunEvent, StepCheckpoint, SupersededStep, WorkflowRun

logger = logging.getLogger("agentflow.store.runs")  # the name hosts' LOGGING knows

_RUN_AT_STEP = f"id = %s AND current_seq = %s AND status IN ({sql.placeholders(ACTIVE)})"


class RunLike(Protocol):
    """What the failure path needs of a run: a model instance or the hot path's StepState."""

    @property
    def id(self) -> str: ...
    @property
    def error(self) -> str: ...
    @property
    def compensations(self) -> Sequence[str]: ...
    @property
    def cancel_requested(self) -> bool: ...


class Fenced(Exception):
    """Raised inside a transaction to roll it back: someone else owns this step or run now."""


def enqueue_grace() -> timedelta:
    """How long a queued step may wait for a worker before the sweeper publishes it again."""
    return timedelta(seconds=settings.AGENTFLOW_LEASE_SECONDS)


def run_create(
    *,
    workflow: Workflow,
    input: Any,
    business_key: str | None,
    priority: int | None = None,
    concurrency_key: str = "",
) -> tuple[str, bool]:
    """Create a run (or find the one with this business key) and publish its first step; with
    a `concurrency_key` (its digest) over the workflow's cap, create it waiting instead."""
    if business_key is not None:
        existing = _run_id_by_key(workflow.name, business_key)
        if existing:
            return existing, False
    # Inside the caller's transaction a savepoint keeps a lost business-key race from aborting
    # it; alone, the INSERT is its own commit: one round trip instead of BEGIN/INSERT/COMMIT.
    # A keyed run's admission and its row commit together (store.concurrency).
    keyed = bool(concurrency_key)
    own = transaction.atomic() if keyed or connection.in_atomic_block else contextlib.nullcontext()
    build = builds.current()
    pinned = workflow.versioning == "pinned"
    try:
        with own:
            build_known(build)
            limit = workflow.concurrency_limit or 1
            admitted = not keyed or concurrency_admit_new(concurrency_key, limit)
            run = WorkflowRun.objects.create(
                workflow=workflow.name,
                version=workflow.version,
                input=input,
                business_key=business_key,
                status=RunStatus.PENDING if admitted else RunStatus.WAITING,
                current_step=workflow.first_step(),
                current_seq=1,
                wake_at=_db_now_plus(
                    enqueue_grace() if admitted else timedelta(seconds=WAIT_WAKE_SECONDS)
                ),
                build=build,
                started_build=build,
                pinned=pinned,
                priority=priority,
                concurrency_key=concurrency_key,
                concurrency_limit=limit if keyed else None,
                hold="" if admitted else token(concurrency_key),
            )
            if not admitted:
                concurrency_held(run.id, reason(workflow.name, limit), concurrency_key)
                return run.id, True
            hint = dispatch.fresh_hint(workflow, run.current_step)
            dispatch.send_step_on_commit(
                run.id, 1, fresh=hint, queue=builds.route(build, pinned), priority=priority
            )
    except IntegrityError:
        if business_key is None:
            raise
        existing = _run_id_by_key(workflow.name, business_key)
        if existing is None:
            raise
        return existing, False
    return run.id, True


def _db_now_plus(delta: timedelta) -> ExpressionWrapper:
    """The database's clock plus `delta`, as the INSERT's value: the sweeper compares `wake_at`
    with the database's clock, so a host whose clock is off must not set it."""
    return ExpressionWrapper(Now() + delta, output_field=DateTimeField())


def _run_id_by_key(workflow: str, business_key: str) -> str | None:
    return (
        WorkflowRun.objects.filter(workflow=workflow, business_key=business_key)
        .values_list("id", flat=True)
        .first()
    )


def outputs_load(
    run_id: str, before_seq: int, *, every_branch: bool = False
) -> list[tuple[str, Any]]:
    """Outputs of the completed steps before `before_seq`, as (name, output) in order: folded
    by name a later one wins, but a agent view may skip calls that were refused.
    `every_branch`: with those of the branches a fork set aside first, for a compensation."""
    outputs: list[tuple[str, Any]] = []
    if every_branch:
        earlier = SupersededStep.objects.filter(run_id=run_id, status=StepStatus.COMPLETED)
        outputs += earlier.order_by("branch", "seq").values_list("name", "output")
    rows = (
        StepCheckpoint.objects.filter(
            run_id=run_id, seq__lt=before_seq, status=StepStatus.COMPLETED
        )
        .order_by("seq")
        .values_list("name", "output")
    )
    outputs += rows
    return outputs


# --- parking ------------------------------------------------------------------------------------
def run_park(
    run_id: str,
    seq: int,
    reason: str,
    *,
    kind: str = RunEvent.Kind.NEEDS_ATTENTION,
    fence: int | None,
    claimed: bool = False,
    data: dict[str, Any] | None = None,
) -> bool:
    """Stop an active run for an operator, with the reason on the run and in an event.

    Fenced: only while the run is still active at `seq` and its checkpoint there still has
    `fence` (None: there is no checkpoint). `claimed`: the caller holds the claim with that
    fence; it is released (the lease ends, the fence moves on) but the checkpoint stays
    IN_PROGRESS, because its effect may have happened: an operator's retry asks the partner
    first. Returns whether the run was parked.
    """
    with transaction.atomic():
        if claimed:
            assert fence is not None
            if not sql.update(
                sql.STEPS,
                {
                    "lease_expires_at": sql.at_now(),
                    "lease_owner": "",
                    "lease_lock": None,
                    "fence": fence + 1,
                    "error": reason[:4000],
                },
                "run_id = %s AND seq = %s AND status = %s AND fence = %s",
                [run_id, seq, StepStatus.IN_PROGRESS, fence],
            ):
                return False
            checkpoint_fence, fence_params = "", []
        elif fence is None:
            checkpoint_fence = (
                f" AND NOT EXISTS (SELECT 1 FROM {sql.STEPS} c WHERE c.run_id = %s AND c.seq = %s)"
            )
            fence_params = [run_id, seq]
        else:
            checkpoint_fence = f" AND EXISTS (SELECT 1 FROM {sql.STEPS} c WHERE c.run_id = %s AND c.seq = %s AND c.fence = %s)"  # noqa: E501
            fence_params = [run_id, seq, fence]
        moved = sql.update(
            sql.RUNS,
            {
                "status": RunStatus.NEEDS_ATTENTION,
                "error": reason,
                "wake_at": None,
                "updated_at": sql.at_now(),
            },
            _RUN_AT_STEP + checkpoint_fence,
            [run_id, seq, *ACTIVE, *fence_params],
        )
        if not moved:
            if claimed:
                raise_rollback()
            return False
        event_add(run_id, kind, reason, seq=seq, data=data)
    logger.warning("run %s needs attention: %s", run_id, masked(run_id, reason))
    return True


def raise_rollback() -> None:
    """Roll back the enclosing atomic block without an error reaching the caller."""
    transaction.set_rollback(True)


# --- failures -----------------------------------------------------------------------------------
def step_fail(
    run: RunLike,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    *,
    claim: Claim | None,
    seen: CheckpointRow | None,
    error: str,
    retry_in_seconds: float | None,
) -> bool:
    """Record a failed attempt whose effect did not happen (or a read that failed). With
    `retry_in_seconds` the run waits and retries under the same key; without it the run fails
    for good, compensating first for the effects it made. Returns False when fenced out.

    `claim`: the attempt's claim (effect and llm steps); else `seen`, the checkpoint as the
    attempt found it (read and db steps, which write nothing before they finish).
    """
    attempt = claim.attempt if claim is not None else (seen.attempts + 1 if seen else 1)
    changes: dict[str, Any] = {
        "status": StepStatus.FAILED,
        "error": error[:4000],
        "retryable": retry_in_seconds is not None,
        "retry_at": None if retry_in_seconds is None else sql.at_now_plus(retry_in_seconds),
        "lease_expires_at": None,
        "lease_owner": "",
        "lease_lock": None,
        "finished_at": sql.at_now(),
    }
    try:
        with transaction.atomic():
            ended = sql.db_now()
            _write_failed_checkpoint(run.id, step, seq, claim, seen, attempt, changes)
            if retry_in_seconds is not None:
                _wait(run, seq, retry_in_seconds)
            else:
                _fail_run(run, workflow, step, seq, error)
            event_add(
                run.id,
                RunEvent.Kind.ATTEMPT_FAILED,
                f"{step.name} attempt {attempt}: {error}"[:4000],
                seq=seq,
                data={
                    "attempt": attempt,
                    "fence": claim.fence if claim is not None else None,
                    "started_at": event_time(claim.started_at if claim else None),
                    "ended_at": event_time(ended),
                    "error": error[:1000],
                    "retry_at": event_time(
                        ended + timedelta(seconds=retry_in_seconds)
                        if retry_in_seconds is not None
                        else None
                    ),
                    "owner": "",
                },
            )
    except (Fenced, IntegrityError):
        logger.info("failure of %s step %s was fenced out", run.id, seq)
        return False
    return True


def _write_failed_checkpoint(
    run_id: str,
    step: StepDef,
    seq: int,
    claim: Claim | None,
    seen: CheckpointRow | None,
    attempt: int,
    changes: dict[str, Any],
) -> None:
    if claim is not None:
        where = "run_id = %s AND seq = %s AND status = %s AND fence = %s"
        params: list[Any] = [run_id, seq, StepStatus.IN_PROGRESS, claim.fence]
        changes = {**changes, "fence": claim.fence + 1}
    elif seen is not None:
        where = "run_id = %s AND seq = %s AND fence = %s AND status <> %s"
        params = [run_id, seq, seen.fence, StepStatus.COMPLETED]
        changes = {**changes, "fence": seen.fence + 1, "attempts": attempt}
    else:
        sql.insert(
            sql.STEPS,
            {
                **changes,
                "run_id": run_id,
                "seq": seq,
                "name": step.name,
                "kind": step.kind,
                "attempts": 1,
                "fence": sql.first_fence(run_id),
                "idempotency_key": step.key or idempotency_key(run_id, seq),
                "arguments": step.arguments,
                "digest": step.digest,
                "first_started_at": sql.at_now(),
                "started_at": sql.at_now(),
            },
        )
        return
    if not sql.update(sql.STEPS, changes, where, params):
        raise Fenced


def _wait(run: RunLike, seq: int, delay: float) -> None:
    """WAITING until the retry time, by the database's clock. The sweeper wakes the run at
    exactly that time if the countdown message is lost or comes early."""
    moved = sql.update(
        sql.RUNS,
        {
            "status": RunStatus.WAITING,
            "wake_at": sql.at_now_plus(delay),
            "updated_at": sql.at_now(),
            "hold": "",  # it waits to retry, not for a build or a partner's turn
        },
        _RUN_AT_STEP,
        [run.id, seq, *ACTIVE],
    )
    if not moved:
        raise Fenced
    if delay <= dispatch.MAX_COUNTDOWN_SECONDS:
        dispatch.send_step_on_commit(run.id, seq, countdown=delay)


def _fail_run(run: RunLike, workflow: Workflow, step: StepDef, seq: int, error: str) -> None:
    reason = f"{step.name}: {error}"
    if step.compensation_only:
        # Undoing failed too: nothing safe is left to try without a human.
        message = f"compensation failed: {reason} (after: {run.error})"
        if not sql.update(
            sql.RUNS,
            {
                "status": RunStatus.NEEDS_ATTENTION,
                "error": message,
                "wake_at": None,
                "updated_at": sql.at_now(),
            },
            _RUN_AT_STEP,
            [run.id, seq, *ACTIVE],
        ):
            raise Fenced
        event_add(run.id, RunEvent.Kind.NEEDS_ATTENTION, message, seq=seq)
        return
    begin_undo(run, workflow, seq=seq, reason=reason)


def begin_undo(
    run: RunLike,
    workflow: Workflow,
    *,
    seq: int,
    reason: str,
    statuses: Sequence[str] = ACTIVE,
    ended: str | None = None,
) -> list[str]:
    """Fail (or cancel) the run: run the compensations of the effects it made, latest first,
    then the workflow's `on_failure` step, from `seq + 1` on; or end it now if there are none.
    Never at `seq` itself, even when nothing was recorded there: that seq belongs to the
    forward step, whose worker may still hold the run as it was (a compensation sharing it
    would meet that step's checkpoint and park as a "non-deterministic definition").

    Fenced on the run being at `seq` in one of `statuses`; `ended`: the status to end with
    (default FAILED, or CANCELLED when cancel was requested). Part of the caller's transaction;
    raises Fenced if the run moved on. Returns the compensation plan (empty: it ended).
    """
    final = ended or (RunStatus.CANCELLED if run.cancel_requested else RunStatus.FAILED)
    next_seq = seq + 1
    plan = compensation_plan(run.id, workflow, seq)
    changes: dict[str, Any] = {"error": reason, "updated_at": sql.at_now()}
    if final == RunStatus.CANCELLED:
        changes["cancel_requested"] = True
    if plan:
        changes.update(
            status=RunStatus.RUNNING,
            current_step=plan[0],
            batch_last=None,  # a batch that failed: its compensations run one at a time
            current_seq=next_seq,
            compensations=plan[1:],
            wake_at=sql.at_now_plus(enqueue_grace().total_seconds()),
        )
    else:
        changes.update(status=final, wake_at=None)
    fence = f"id = %s AND current_seq = %s AND status IN ({sql.placeholders(statuses)})"
    if not sql.update(sql.RUNS, changes, fence, [run.id, seq, *statuses]):
        raise Fenced
    if not plan:
        telemetry.run_finished(run.id, workflow.name, final)
        run_ended(run.id)
        concurrency_run_ended(run)
        return plan
    undo = [name for name in plan if name != workflow.on_failure]
    event_add(
        run.id,
        RunEvent.Kind.COMPENSATION,
        f"{reason}; undoing with {', '.join(plan)}",
        seq=seq,
        data={"undo": undo, "notify": workflow.on_failure if workflow.on_failure in plan else None},
    )
    dispatch.send_step_on_commit(run.id, next_seq, fresh=dispatch.fresh_hint(workflow, plan[0]))
    return plan


def compensation_plan(run_id: str, workflow: Workflow, before_seq: int) -> list[str]:
    """Compensation steps for the effects known to have happened before `before_seq` (made or
    adopted: COMPLETED, and not a refused call), latest first, then those of superseded
    branches that the current one did not adopt, then the workflow's `on_failure` step. Each
    names the exact call it undoes.

    Known, because an effect whose outcome is unknown cannot be undone blindly: cancel and fork
    ask the partner first, and the forward path never moves past one
    (docs/protocol.md, "Unknown outcomes")."""
    done = StepCheckpoint.objects.filter(run_id=run_id, seq__lt=before_seq).order_by("-seq")
    # A call of a forked run that adopted an earlier branch's call made no request of its own:
    # the effect under its key is that call's.
    adopted = dict(
        SupersededStep.objects.filter(
            run_id=run_id, idempotency_key__in=done.values("idempotency_key")
        ).values_list("idempotency_key", "kind")
    )
    plan = []
    for cp in done.only("name", "seq", "kind", "status", "retryable", "idempotency_key", "output"):
        kind = adopted.get(cp.idempotency_key, cp.kind)
        if _happened(kind, cp.status, cp.retryable):
            undo = workflow.compensation_for(cp.name, cp.seq, output=cp.output)
            if undo is not None:
                plan.append(undo)
    # A forked run: effects of a superseded branch that no current call adopted happened too
    # (a fork settles every set-aside effect first, so each is COMPLETED or FAILED for good).
    taken = StepCheckpoint.objects.filter(run_id=run_id).values("idempotency_key")
    earlier = (
        SupersededStep.objects.filter(run_id=run_id)
        .exclude(idempotency_key__in=taken)
        .order_by("-branch", "-seq")
    )
    for name, kind, status, branch, seq, output in earlier.values_list(
        "name", "kind", "status", "branch", "seq", "output"
    ):
        if _happened(kind, status, False):
            undo = workflow.compensation_for(name, seq, output=output, branch=branch)
            if undo is not None:
                plan.append(undo)
    if workflow.on_failure:
        plan.append(workflow.on_failure)
    return plan


def _happened(kind: str, status: str, retryable: bool) -> bool:
    """Known to have happened: it may have, and its outcome is settled. A `db` step's writes
    commit with its COMPLETED checkpoint, so it happened once that is recorded (the children
    an agent run's `start_children` call started: docs/workflows.md, "Runs that start runs")."""
    if kind == StepKind.DB:
        return status == StepStatus.COMPLETED
    return outcomes.may_have_happened(
        kind=kind, status=status, retryable=retryable
    ) and not outcomes.unsettled(kind=kind, status=status, retryable=retryable)


def attempt_lost(run_id: str, step: StepDef, seq: int) -> CheckpointRow | None:
    """Count an attempt of a `read` or `db` step whose worker died mid-step (its message came
    back), and return the checkpoint as it now is.

    Those steps write nothing before they finish, so without this a step that kills its worker
    every time would be redelivered for ever; counted, it meets the retry bound. Done under the
    run's row lock, the same lock a running `db` step holds, so a duplicate delivery never
    races a step that is still running into a conflict.
    """
    error = "the worker died while running this step"
    with transaction.atomic():
        state = state_load(run_id, seq, lock=True)
        if state is None or state.status not in ACTIVE or state.current_seq != seq:
            return None
        seen = state.checkpoint
        if seen is not None and seen.status == StepStatus.COMPLETED:
            return seen
        _write_failed_checkpoint(
            run_id,
            step,
            seq,
            None,
            seen,
            seen.attempts + 1 if seen is not None else 1,
            {
                "status": StepStatus.FAILED,
                "error": error,
                "retryable": True,
                "retry_at": None,
                "lease_expires_at": None,
                "lease_owner": "",
                "lease_lock": None,
                "finished_at": sql.at_now(),
            },
        )
        event_add(
            run_id,
            RunEvent.Kind.ATTEMPT_FAILED,
            f"{step.name}: {error}",
            seq=seq,
            data={
                "attempt": seen.attempts + 1 if seen is not None else 1,
                "fence": None,
                "started_at": None,
                "ended_at": event_time(sql.db_now()),
                "error": error,
                "retry_at": None,
                "owner": "",
            },
        )
        after = state_load(run_id, seq)
    return after.checkpoint if after is not None else None
