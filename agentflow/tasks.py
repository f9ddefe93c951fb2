"""Thin Celery tasks: take ids, call one function. The sweeper's beat schedule lives here."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings

from agentflow import dispatch, recovery, runtime
from agentflow.celery import app


@shared_task(bind=True, name=dispatch.RUN_STEP_TASK, acks_late=True, reject_on_worker_lost=True)
def run_step_task(self: Any, run_id: str, seq: int) -> None:
    # Redelivered: the process that had this message died, maybe just after completing the step.
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    runtime.run_step(run_id, seq, redelivered=redelivered)


@shared_task(name="agentflow.sweep", acks_late=False)
def sweep_task() -> None:
    # Early ack: a lost sweep is replaced by the next tick, and a redelivered one is pointless.
    recovery.sweep()


@app.on_after_finalize.connect
def _schedule_sweeper(sender: Any, **kwargs: Any) -> None:
    interval = settings.AGENTFLOW_SWEEP_INTERVAL
    # Expire unsent ticks so a backlog of sweeps does not pile up while workers are down.
    sender.add_periodic_task(
        float(interval), sweep_task.s(), name="agentflow-sweeper", expires=interval * 0.9
    )
