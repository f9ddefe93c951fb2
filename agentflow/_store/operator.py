"""What operators do to runs (retry, resume now, cancel) and the cancellation a worker carries
out.

Each action takes the run's row lock, checks that it is safe, and moves the checkpoint's fence
on, so a worker still holding an older claim changes nothing afterwards (I5). Each is recorded
as an event with the operator and the reason (I6).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from agentflow import _concurrency
from agentflow._base import outcomes
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus, StepKind, StepStatus
from agentflow._core import dispatch, registry
from agentflow._core.registry import Workflow
from agentflow._observe import telemetry
from agentflow._store import sql
from agentflow._store.concurrency import (
    WAIT_WAKE_SECONDS,
    concurrency_admit_new,
    concurrency_held,
    concurrency_run_ended,
)
from agentflow._store.events import event_add, event_time
from agentflow._store.parents import run_ended
from agentflow._store.runs import Fenced, begin_undo, enqueue_grace
from agentflow.exceptions import ActionRefused
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun


def locked_run(run_id: str) -> WorkflowRun:
    run = WorkflowRun.objects.select_for_update().filter(pk=run_id).first()
    if run is None:
        raise ActionRefused("no such run")
    return run


def _checkpoint(run_id: str, seq: int) -> StepCheckpoint | None:
    return StepCheckpoint.objects.filter(run_id=run_id, seq=seq).first()


def wake_soon() -> sql.Expr:
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
        run = locked_run(run_id)
        if run.status == RunStatus.NEEDS_ATTENTION:
            seq, step_name = run.current_seq, run.current_step
            # A batch parks at its first position, whichever member asked (`batch_park`):
            # every member gets its fresh budget.
            for member in range(seq, (run.batch_last or seq) + 1):
                _release_for_retry(run_id, member)
        elif run.status == RunStatus.FAILED:
            seq, step_name = _resume_failed(run)
        else:
            raise ActionRefused(
                f"only failed or parked runs can be retried (this one is {run.status})"
            )
        if run.status == RunStatus.FAILED and _waits_for_its_key(run, seq, step_name):
            event_add(
                run_id,
                RunEvent.Kind.OPERATOR_RETRY,
                reason or "(no reason given)",
                actor=actor,
                seq=seq,
            )
            limit = int(run.concurrency_limit or 1)
            why = _concurrency.reason(run.workflow, limit)
            concurrency_held(run_id, why, run.concurrency_key, seq=seq)
            return
        moved = sql.update(
            sql.RUNS,
            {
                "status": RunStatus.RUNNING,
                "error": "",
                "current_seq": seq,
                "current_step": step_name,
                "wake_at": wake_soon(),
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


def _waits_for_its_key(run: WorkflowRun, seq: int, step_name: str) -> bool:
    """A failed run gave its concurrency key's place up when it failed: retried, it takes a
    place again through the key's admission, as a start does, or waits for one in line
    (WAITING, held, nothing published) if the key is full (docs/workflows.md, "Concurrency
    keys"). A parked run kept its place, and needs none of this."""
    digest = run.concurrency_key
    limit = int(run.concurrency_limit or 1)
    if not digest or concurrency_admit_new(digest, limit):
        return False
    moved = sql.update(
        sql.RUNS,
        {
            "status": RunStatus.WAITING,
            "error": "",
            "current_seq": seq,
            "current_step": step_name,
            "hold": _concurrency.token(digest),
            "wake_at": sql.at_now_plus(WAIT_WAKE_SECONDS),
            "updated_at": sql.at_now(),
        },
        "id = %s",
        [run.id],
    )
    assert moved == 1
    return True


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


def refuse_if_undone(run: WorkflowRun) -> None:
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
    after it). The failed attempt's effect did not happen (docs/protocol.md, "Unknown outcomes"), so
    a new key is safe."""
    refuse_if_undone(run)
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
        run = locked_run(run_id)
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
                {"wake_at": wake_soon(), "updated_at": sql.at_now()},
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
    worker that moves the run on carries it out. An effect that may have happened (its answer
    lost, backing off, or parked "outcome unknown") is settled first
    (docs/protocol.md, "Operator actions"): a worker asks the partner, adopts it if found (then it
    is undone), and parks the run "outcome unknown" if the partner cannot tell. Refused while the
    run is already undoing a failure.

    Returns None when the run ended CANCELLED at once, else what happens next, in words.
    """
    why = reason or "(no reason given)"
    with transaction.atomic():
        run = locked_run(run_id)
        if run.status not in (*ACTIVE_RUN_STATUSES, RunStatus.NEEDS_ATTENTION):
            raise ActionRefused("only unfinished runs can be cancelled")
        workflow = registry.lookup(run.workflow, run.version)
        step = workflow.step_named(run.current_step) if workflow is not None else None
        cp = _checkpoint(run_id, run.current_seq)
        unknown = cp is not None and outcomes.unsettled(
            kind=cp.kind, status=cp.status, retryable=cp.retryable
        )
        if (
            cp is not None
            and unknown
            and run.cancel_requested
            and run.status == (RunStatus.NEEDS_ATTENTION)
        ):
            raise ActionRefused(
                f"it is cancelled already and waits to learn whether {cp.name} took effect; "
                "Retry asks the partner again"
            )
        if run.cancel_requested or (step is not None and step.compensation_only):
            raise ActionRefused("it is already undoing its effects; it ends once the undo is done")
        in_flight = cp is not None and cp.status == StepStatus.IN_PROGRESS
        if cp is not None and unknown and workflow is not None:
            if run.status == RunStatus.NEEDS_ATTENTION:
                return _settle_then_cancel(run, cp, actor=actor, why=why, release=True)
            if cp.status == StepStatus.FAILED:
                return _settle_then_cancel(run, cp, actor=actor, why=why, release=False)
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


def _settle_then_cancel(
    run: WorkflowRun, cp: StepCheckpoint, *, actor: str, why: str, release: bool
) -> str:
    """The current effect may have happened: a worker asks the partner now (the step's retry
    made due; a parked one released under a new fence), and the cancel follows what it finds."""
    if release:
        _release_for_retry(run.id, cp.seq)
    else:
        sql.update(sql.STEPS, {"retry_at": sql.at_now()}, "id = %s", [cp.id])
    sql.update(
        sql.RUNS,
        {
            "cancel_requested": True,
            "status": RunStatus.RUNNING if release else run.status,
            "error": f"cancelled by {actor}: {why}",
            "wake_at": wake_soon(),
            "updated_at": sql.at_now(),
        },
        "id = %s",
        [run.id],
    )
    event_add(
        run.id,
        RunEvent.Kind.OPERATOR_CANCEL,
        f"{why} (requested: whether {cp.name} took effect is unknown; the partner is asked first)",
        actor=actor,
        seq=cp.seq,
    )
    dispatch.send_step_on_commit(run.id, cp.seq)
    return (
        f"cancel requested: whether {cp.name} took effect is unknown, so the partner is asked "
        "first; what it did is then undone (or the run is parked if the partner cannot tell)"
    )


def cancel_begin(run_id: str, seq: int) -> bool:
    """Carry out a requested cancel at a step boundary (the worker calls this instead of
    running the next forward step). Returns False if the run moved on meanwhile."""
    with transaction.atomic():
        run = locked_run(run_id)
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
    """Nothing is in flight and every effect's outcome is known: undo what was done and end
    CANCELLED. Returns the undo plan."""
    seq = run.current_seq
    if cp is not None and outcomes.unsettled(
        kind=cp.kind, status=cp.status, retryable=cp.retryable
    ):
        raise ActionRefused(f"whether {cp.name} took effect is unknown; the partner is asked first")
    if cp is not None:
        sql.update(sql.STEPS, {"fence": cp.fence + 1}, "id = %s", [cp.id])  # nothing resumes it
    if workflow is None:
        made = [
            done
            for done in StepCheckpoint.objects.filter(run_id=run.id, kind=StepKind.EFFECT)
            if outcomes.may_have_happened(
                kind=done.kind, status=done.status, retryable=done.retryable
            )
        ]
        if made:
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
        run_ended(run.id)
        concurrency_run_ended(run)
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
