"""Publishing step messages: the broker is a doorbell, never the state of record."""

from __future__ import annotations

import logging

from django.db import transaction

from agentflow.celery import app

logger = logging.getLogger(__name__)

RUN_STEP_TASK = "agentflow.run_step"
#: Retry delays up to this go out as a Celery countdown too; longer ones only wait in Postgres
#: for the sweeper (a long countdown sits unacked in worker memory and can loop past the
#: visibility timeout).
MAX_COUNTDOWN_SECONDS = 30.0


def send_step(run_id: str, seq: int, *, countdown: float | None = None) -> bool:
    """Publish now. A broker error is logged, not raised: the run's `wake_at` lets the sweeper
    publish it again, so a lost doorbell costs latency, never the run."""
    try:
        app.send_task(RUN_STEP_TASK, args=(run_id, seq), countdown=countdown)
    except Exception as exc:  # kombu raises OperationalError and friends
        logger.warning("could not enqueue %s step %s (%s); the sweeper will", run_id, seq, exc)
        return False
    return True


def send_step_on_commit(run_id: str, seq: int, *, countdown: float | None = None) -> None:
    transaction.on_commit(lambda: send_step(run_id, seq, countdown=countdown))
