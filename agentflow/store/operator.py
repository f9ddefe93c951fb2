"""Operator writes beyond retry and cancel: "Resume now" rings an active run's doorbell at once."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from agentflow import dispatch
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.states import ACTIVE_RUN_STATUSES, RunStatus, StepStatus
from agentflow.store.runs import ActionRefused, enqueue_grace


def run_resume(run_id: str, *, actor: str, reason: str) -> None:
    """Publish an active run's current step now, instead of at its wake-up time.

    A run backing off (WAITING) has its retry moved to now, so the message is not dropped as
    early. Nothing else changes: a step a live worker holds stays with it (the new message
    finds the lease held and does nothing), and publishing twice is harmless, as for the
    sweeper. The message goes out only once the event is committed.
    """
    now = timezone.now()
    with transaction.atomic():
        run = (
            WorkflowRun.objects.select_for_update()
            .filter(pk=run_id)
            .values("status", "current_seq", "wake_at")
            .first()
        )
        if run is None:
            raise ActionRefused("no such run")
        status, seq, wake_at = run["status"], run["current_seq"], run["wake_at"]
        if status not in ACTIVE_RUN_STATUSES:
            raise ActionRefused(
                f"only active runs can be resumed now (this one is {status}); "
                "a failed or parked run needs Retry"
            )
        if status == RunStatus.WAITING:
            StepCheckpoint.objects.filter(
                run_id=run_id, seq=seq, status=StepStatus.FAILED, retryable=True
            ).update(retry_at=now)
            # The runtime reads the retry time as wake_at minus the enqueue grace.
            WorkflowRun.objects.filter(pk=run_id).update(
                wake_at=now + enqueue_grace(), updated_at=now
            )
        RunEvent.objects.create(
            run_id=run_id,
            kind=RunEvent.Kind.OPERATOR_RESUME,
            actor=actor,
            detail=reason or "(no reason given)",
            seq=seq,
            data={"status": status, "wake_at": wake_at.isoformat() if wake_at else None},
        )
        dispatch.send_step_on_commit(run_id, seq)
