"""What operators do to runs (retry, resume now, cancel) and the cancellation a worker carries
out.

Each action takes the run's row lock, checks that it is safe, and moves the checkpoint's fence
on, so a worker still holding an older claim changes nothing afterwards (I5). Each is recorded
as an event with the operator and the reason (I6).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from agentflow import dispatch, registry, telemetry
from agentflow.models import RunEvent, StepCheckpoint, SupersededStep, WorkflowRun
from agentflow.registry import Workflow
from agentflow.states import ACTIVE_RUN_STATUSES, RunStatus, StepKind, StepStatus
from agentflow.store import sql
from agentflow.store.events import event_add, event_time
from agentflow.store.runs import ActionRefused, Fenced, begin_undo, enqueue_grace


def _locked_run(run_id: str) -> WorkflowRun:
    run = WorkflowRun.objects.select_for_update().filter(pk=run_id).first()
    if run is None:
        raise ActionRefused("no such run")
    return run


def _checkpoint(run_id: str, seq: int) -> StepCheckpoint | None:
    return StepCheckpoint.objects.filter(run_id=run_id, seq=seq).first()


def _wake_soon() -> sql.Expr:
    return sql.at_now_plus(enqueue_grace().total_seconds())


# --- retry --------------------------------------------------------------------------------------
def run_retry(run_id: str, *, actor: str, reason: str) -> None:
    """Resume a parked or failed run at the step where it stopped, with a fresh retry budget.

    A step whose outcome is unknown keeps its idempotency key and is claimed as a takeover: it
    asks the partner first (reconcile) and never repeats an effect blindly. A failed run may be
    retried only if its compensation undid nothing (it only told the customer): a run whose
    effects were undone would be resumed half-served.
    """
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.status == RunStatus.NEEDS_ATTENTION:
            seq, step_name = run.current_seq, run.current_step
            _release_for_retry(run_id, seq)
        elif run.status == RunStatus.FAILED:
            seq, step_name = _resume_failed(run)
        else:
            raise ActionRefused(
                f"only failed or parked runs can be retried (this one is {run.status})"
            )
        moved = sql.update(
            sql.RUNS,
            {
                "status": RunStatus.RUNNING,
                "error": "",
                "current_seq": seq,
                "current_step": step_name,
                "wake_at": _wake_soon(),
                "updated_at": sql.at_now(),
            },
            "id = %s",
            [run_id],
        )
        assert moved == 1
        event_add(
            run_id,
            RunEvent.Kind.OPERATOR_RETRY,
            reason or "(no reason given)",
            actor=actor,
            seq=seq,
        )
        workflow = registry.lookup(run.workflow, run.version)
        hint = None
        if workflow is not None and step_name in workflow.steps:
            hint = dispatch.fresh_hint(workflow, step_name)
        dispatch.send_step_on_commit(run_id, seq, fresh=hint)


def _release_for_retry(run_id: str, seq: int) -> None:
    """A fresh retry budget for the checkpoint at `seq`, under the same key and a new fence.

    FAILED becomes retryable at once; IN_PROGRESS (an unknown outcome, or a claim whose owner
    is gone) has its lease ended, so the next claim is a takeover that reconciles first."""
    cp = _checkpoint(run_id, seq)
    if cp is None or cp.status == StepStatus.COMPLETED:
        return
    changes: dict[str, Any] = {"attempts": 0, "fence": cp.fence + 1}
    if cp.status == StepStatus.FAILED:
        changes.update(retryable=True, retry_at=None)
    else:
        changes.update(lease_expires_at=sql.at_now(), lease_owner="", lease_lock=None)
    sql.update(sql.STEPS, changes, "id = %s AND fence = %s", [cp.id, cp.fence])


def _refuse_if_undone(run: WorkflowRun) -> None:
    """A failed run whose compensation undid effects cannot be resumed: it would be served
    half (the fee refunded, the rebooking done)."""
    for event in RunEvent.objects.filter(run_id=run.id, kind=RunEvent.Kind.COMPENSATION):
        data = event.data or {}
        if data.get("undo", ["(unrecorded)"]):
            raise ActionRefused(
                "this run's effects were undone by compensation "
                f"({', '.join(data.get('undo', [])) or 'recorded before undo lists'}); "
                "start a new one"
            )


def _resume_failed(run: WorkflowRun) -> tuple[int, str]:
    """Where a failed run resumes: its failed forward step, at the same seq if nothing ran
    after it, else at a new seq (the compensation steps that told the customer took the ones
    after it). The failed attempt's effect did not happen (SPEC 3.3a), so a new key is safe."""
    _refuse_if_undone(run)
    workflow = registry.lookup(run.workflow, run.version)
    if workflow is None:
        raise ActionRefused(f"{run.workflow} v{run.version} is not deployed; it cannot resume")
    forward = set(workflow.forward_steps)
    failed = (
        StepCheckpoint.objects.filter(run_id=run.id, status=StepStatus.FAILED, name__in=forward)
        .order_by("-seq")
        .first()
    )
    if failed is None:
        raise ActionRefused("no failed step to resume at")
    last_seq = StepCheckpoint.objects.filter(run_id=run.id).order_by("-seq").first()
    if last_seq is not None and last_seq.seq == failed.seq:
        _release_for_retry(run.id, failed.seq)
        return failed.seq, failed.name
    sql.update(
        sql.RUNS,
        {"compensations": [], "cancel_requested": False},
        "id = %s",
        [run.id],
    )
    return (last_seq.seq if last_seq else failed.seq) + 1, failed.name


# --- resume now ---------------------------------------------------------------------------------
def run_resume(run_id: str, *, actor: str, reason: str) -> None:
    """Publish an active run's current step now, instead of at its wake-up time.

    A run backing off (WAITING) has its retry made due now, so the claim takes it at once.
    Nothing else changes and no fence moves: a step a live worker holds stays with it (the new
    message finds the lease held and does nothing), and publishing twice is harmless, as for
    the sweeper. The message goes out only once the event is committed.
    """
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.status not in ACTIVE_RUN_STATUSES:
            raise ActionRefused(
                f"only active runs can be resumed now (this one is {run.status}); "
                "a failed or parked run needs Retry"
            )
        seq = run.current_seq
        if run.status == RunStatus.WAITING:
            sql.update(
                sql.STEPS,
                {"retry_at": sql.at_now()},
                "run_id = %s AND seq = %s AND status = %s AND retryable",
                [run_id, seq, StepStatus.FAILED],
            )
            sql.update(
                sql.RUNS,
                {"wake_at": _wake_soon(), "updated_at": sql.at_now()},
                "id = %s",
                [run_id],
            )
        event_add(
            run_id,
            RunEvent.Kind.OPERATOR_RESUME,
            reason or "(no reason given)",
            actor=actor,
            seq=seq,
            data={"status": run.status, "wake_at": event_time(run.wake_at)},
        )
        dispatch.send_step_on_commit(run_id, seq)


# --- cancel -------------------------------------------------------------------------------------
def run_cancel(run_id: str, *, actor: str, reason: str) -> str | None:
    """Stop a run that has not finished, without keeping any money (I8).

    Effects it made are undone by their compensations (the fee refunded) and the customer is
    told (the `on_failure` step); then it ends CANCELLED. A step in flight finishes first, so
    its outcome is known before anything is undone: the cancel is recorded as requested and the
    worker that moves the run on carries it out. Refused while an outcome is unknown or while
    the run is already undoing a failure.

    Returns None when the run ended CANCELLED at once, else what happens next, in words.
    """
    why = reason or "(no reason given)"
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.status not in (*ACTIVE_RUN_STATUSES, RunStatus.NEEDS_ATTENTION):
            raise ActionRefused("only unfinished runs can be cancelled")
        workflow = registry.lookup(run.workflow, run.version)
        step = workflow.steps.get(run.current_step) if workflow is not None else None
        if run.cancel_requested or (step is not None and step.compensation_only):
            raise ActionRefused("it is already undoing its effects; it ends once the undo is done")
        cp = _checkpoint(run_id, run.current_seq)
        in_flight = cp is not None and cp.status == StepStatus.IN_PROGRESS
        if in_flight and run.status == RunStatus.NEEDS_ATTENTION:
            raise ActionRefused(
                f"whether {run.current_step} took effect is unknown; retry it first (it asks "
                "the partner), then cancel"
            )
        if in_flight:
            sql.update(sql.RUNS, {"cancel_requested": True}, "id = %s", [run_id])
            event_add(
                run_id,
                RunEvent.Kind.OPERATOR_CANCEL,
                f"{why} (requested: {run.current_step} is running and finishes first)",
                actor=actor,
                seq=run.current_seq,
            )
            return (
                f"cancel requested: {run.current_step} is running and finishes first, then "
                "whatever the run did is undone"
            )
        event_add(run_id, RunEvent.Kind.OPERATOR_CANCEL, why, actor=actor, seq=run.current_seq)
        undoing = _cancel_now(run, workflow, cp, reason=f"cancelled by {actor}: {why}")
    return f"cancelling: undoing with {', '.join(undoing)} first" if undoing else None


def cancel_begin(run_id: str, seq: int) -> bool:
    """Carry out a requested cancel at a step boundary (the worker calls this instead of
    running the next forward step). Returns False if the run moved on meanwhile."""
    with transaction.atomic():
        run = _locked_run(run_id)
        if (
            run.status not in ACTIVE_RUN_STATUSES
            or run.current_seq != seq
            or not run.cancel_requested
        ):
            return False
        cp = _checkpoint(run_id, seq)
        if cp is not None and cp.status == StepStatus.IN_PROGRESS:
            return False  # a claim is in flight after all; its completion brings us back
        workflow = registry.lookup(run.workflow, run.version)
        try:
            _cancel_now(run, workflow, cp, reason=run.error or "cancelled by an operator")
        except (ActionRefused, Fenced):
            return False
    return True


def _cancel_now(
    run: WorkflowRun, workflow: Workflow | None, cp: StepCheckpoint | None, *, reason: str
) -> list[str]:
    """Nothing is in flight: undo what was done and end CANCELLED. Returns the undo plan."""
    seq = run.current_seq
    if cp is not None:
        sql.update(sql.STEPS, {"fence": cp.fence + 1}, "id = %s", [cp.id])  # nothing resumes it
    if workflow is None:
        made = StepCheckpoint.objects.filter(
            run_id=run.id, status=StepStatus.COMPLETED, kind=StepKind.EFFECT
        )
        if made.exists():
            raise ActionRefused(
                f"{run.workflow} v{run.version} is not deployed, so its effects cannot be "
                "undone; deploy it, then cancel"
            )
        sql.update(
            sql.RUNS,
            {"status": RunStatus.CANCELLED, "wake_at": None, "error": reason},
            "id = %s",
            [run.id],
        )
        telemetry.run_finished(run.id, run.workflow, RunStatus.CANCELLED)
        return []
    run.cancel_requested = True
    return begin_undo(
        run,
        workflow,
        seq=seq,
        reason=reason,
        statuses=[*ACTIVE_RUN_STATUSES, RunStatus.NEEDS_ATTENTION],
        ended=RunStatus.CANCELLED,
    )


# --- fork (code-first runs) -------------------------------------------------------------------
def fork_preview(run_id: str, position: int) -> list[StepCheckpoint]:
    """The checkpoints a fork from `position` would set aside, in order (what the operator is
    shown before confirming: above all, effects that happened)."""
    return list(StepCheckpoint.objects.filter(run_id=run_id, seq__gte=position).order_by("seq"))


def run_fork(run_id: str, *, position: int, actor: str, reason: str) -> None:
    """Continue a diverged or failed code-first run from `position`, on a new branch.

    Its checkpoints from `position` on are kept as superseded history (still shown, never
    replayed); the run resumes at `position`. A call the new branch makes again with the same
    arguments reuses the superseded result and key (it is not made again); every other new call
    gets a key that names the branch, so no partner mistakes it for an earlier one.
    """
    from agentflow.codefirst import NEXT_CALL, CodeWorkflow

    with transaction.atomic():
        run = _locked_run(run_id)
        workflow = registry.lookup(run.workflow, run.version)
        if not isinstance(workflow, CodeWorkflow):
            raise ActionRefused("only code-first (agent) runs can be forked")
        if run.status not in (RunStatus.NEEDS_ATTENTION, RunStatus.FAILED):
            raise ActionRefused(
                f"only diverged, parked or failed runs can be forked (this one is {run.status})"
            )
        if run.status == RunStatus.FAILED:
            _refuse_if_undone(run)
        last = StepCheckpoint.objects.filter(run_id=run_id).order_by("-seq").first()
        highest = (last.seq if last else 0) + 1
        if not 1 <= position <= highest:
            raise ActionRefused(f"position must be between 1 and {highest}")
        superseded = fork_preview(run_id, position)
        unknown = [
            cp for cp in superseded
            if cp.status == StepStatus.IN_PROGRESS and cp.kind == StepKind.EFFECT
        ]  # fmt: skip
        if unknown:
            raise ActionRefused(
                f"whether {unknown[0].name} (position {unknown[0].seq}) took effect is unknown; "
                "a new branch could repeat it: check the partner, or fork after it"
            )
        now = sql.db_now()
        SupersededStep.objects.bulk_create(
            SupersededStep(
                run_id=run_id,
                branch=run.branch,
                seq=cp.seq,
                name=cp.name,
                kind=cp.kind,
                status=cp.status,
                attempts=cp.attempts,
                idempotency_key=cp.idempotency_key,
                arguments=cp.arguments,
                output=cp.output,
                error=cp.error,
                started_at=cp.started_at,
                finished_at=cp.finished_at,
                superseded_at=now,
            )
            for cp in superseded
        )
        StepCheckpoint.objects.filter(run_id=run_id, seq__gte=position).delete()
        sql.update(
            sql.RUNS,
            {
                "status": RunStatus.RUNNING,
                "branch": run.branch + 1,
                # A stale worker's claim on a set-aside checkpoint must match nothing new.
                "fence_floor": max([run.fence_floor, *(cp.fence for cp in superseded)]),
                "current_seq": position,
                "current_step": NEXT_CALL,
                "compensations": [],
                "cancel_requested": False,
                "error": "",
                "wake_at": _wake_soon(),
                "updated_at": sql.at_now(),
            },
            "id = %s",
            [run_id],
        )
        event_add(
            run_id,
            RunEvent.Kind.FORK,
            f"{reason or '(no reason given)'} (from position {position}; "
            f"{len(superseded)} step(s) set aside as branch {run.branch})",
            actor=actor,
            seq=position,
            data={
                "position": position,
                "branch": run.branch + 1,
                "superseded": [
                    {
                        "seq": cp.seq,
                        "name": cp.name,
                        "kind": cp.kind,
                        "status": cp.status,
                        "key": cp.idempotency_key,
                    }
                    for cp in superseded
                ],
            },
        )
        dispatch.send_step_on_commit(run_id, position)
