"""Thin Celery tasks: take ids, call one function. The sweeper's beat schedule lives here."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from celery.signals import worker_ready
from django.conf import settings

from agentflow import dispatch, recovery, runtime, telemetry
from agentflow.celery import app


@shared_task(bind=True, name=dispatch.RUN_STEP_TASK, acks_late=True, reject_on_worker_lost=True)
def run_step_task(self: Any, run_id: str, seq: int, fresh: dispatch.Fresh | None = None) -> None:
    # Redelivered: the process that had this message died, maybe just after completing the step.
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    with telemetry.step_message(run_id, seq, self.request):  # logs, metrics, trace of the step
        runtime.run_step(run_id, seq, redelivered=redelivered, fresh=fresh)


@shared_task(name="agentflow.sweep", acks_late=False)
def sweep_task() -> None:
    # Early ack: a lost sweep is replaced by the next tick, and a redelivered one is pointless.
    recovery.sweep()


@worker_ready.connect
def _notice_dead_pool_children_quickly(sender: Any, **kwargs: Any) -> None:
    """Check the prefork pool for dead children every half second, not every five.

    Celery notices a killed child when its pipe closes, but when that happens a moment before
    the kernel lets the child be reaped, the check finds it alive and only the pool's 5 s timer
    notices later. Until then the child's step is not redelivered; this makes recovery after a
    child SIGKILL well under two seconds instead of sometimes five.
    """
    pool = getattr(getattr(sender, "pool", None), "_pool", None)
    hub = getattr(getattr(sender, "controller", None), "hub", None)
    if pool is not None and hub is not None and hasattr(pool, "maintain_pool"):
        hub.call_repeatedly(0.5, pool.maintain_pool)


@app.on_after_finalize.connect
def _schedule_sweeper(sender: Any, **kwargs: Any) -> None:
    interval = settings.AGENTFLOW_SWEEP_INTERVAL
    # Expire unsent ticks so a backlog of sweeps does not pile up while workers are down.
    sender.add_periodic_task(
        float(interval), sweep_task.s(), name="agentflow-sweeper", expires=interval * 0.9
    )
