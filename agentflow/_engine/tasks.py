"""Thin Celery tasks: take ids, call one function. Shared tasks, so they bind to the host's
Celery app; beat sends retention's and runs the recovery sweeper itself (agentflow.beat)."""

from __future__ import annotations

import heapq
import logging
from datetime import timedelta
from typing import Any

from celery import shared_task
from celery.signals import celeryd_after_setup, worker_ready, worker_shutdown
from django.db import DatabaseError, InterfaceError, OperationalError, connection

from agentflow import _store as store
from agentflow import beat
from agentflow._builds import roster
from agentflow._conf import settings
from agentflow._core import builds, dispatch, features, outage, pooler
from agentflow._engine import runtime
from agentflow._observe import telemetry

logger = logging.getLogger("agentflow.tasks")  # the name hosts' LOGGING knows

#: How often a worker's event loop drops the time limits of finished tasks from its timer.
TIME_LIMIT_SWEEP_SECONDS = 10.0

#: At most this many batches (of 1,000 runs) a retention tick: a tick stays well inside the
#: task time limit however large the backlog, and the next tick goes on from there.
RETENTION_BATCHES_PER_TICK = 100


#: The step task's own limits, below every broker's visibility timeout (Redis: 3600 s), so a
#: running step is never handed to a second worker; a host changes them by task_annotations.
#: The soft limit turns a hung partner call into a retryable step error under the same step.
STEP_SOFT_TIME_LIMIT = 240
STEP_TIME_LIMIT = 300


@shared_task(
    bind=True,
    name=dispatch.RUN_STEP_TASK,
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=STEP_SOFT_TIME_LIMIT,
    time_limit=STEP_TIME_LIMIT,
)
def run_step_task(self: Any, run_id: str, seq: int, fresh: dispatch.Fresh | None = None) -> None:
    # Redelivered: the process that had this message died, maybe just after completing the step.
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    try:
        with telemetry.step_message(run_id, seq, self.request):  # logs, metrics, its trace
            _run_step(run_id, seq, redelivered=redelivered, fresh=fresh)
    except DatabaseError as exc:
        if not outage.unreachable(exc):
            raise
        # The database does not answer: whatever this message did not commit is undone, so
        # the run waits where its last commit left it, and the sweeper publishes it again
        # once the database answers and its wake-up time (or its step's lease) has passed.
        # Acked as a failure would be, without a traceback per message: the outage is said
        # once.
        outage.noticed(exc, "running steps")
        connection.close()


def _run_step(run_id: str, seq: int, *, redelivered: bool, fresh: dispatch.Fresh | None) -> None:
    try:
        runtime.run_step(run_id, seq, redelivered=redelivered, fresh=fresh)
    except (OperationalError, InterfaceError):
        # The connection this process keeps between steps died under it (the database
        # server restarted or failed over; nothing tells a pooled connection until it is
        # used), or the server went away mid-step. Raised, the message would be acked as
        # failed and the run left to the sweeper (lease + sweep interval). On a new
        # connection, once: run_step is safe to repeat, and if the server is still down
        # this raises as before.
        if connection.connection is not None and connection.is_usable():
            raise  # the connection is fine: a lock or statement timeout, not a lost server
        connection.close()
        runtime.run_step(run_id, seq, redelivered=redelivered, fresh=fresh)
    except DatabaseError as exc:
        if not (pooler.lost_prepared_statement(exc) and pooler.mode() == "auto"):
            raise
        # A pooler lost a prepared statement inside a transaction: the statement never ran
        # and the server rolled the transaction back. This process prepares no more, so
        # the message once more goes through (run_step is safe to repeat).
        pooler.forget_prepared_statements(connection)
        runtime.run_step(run_id, seq, redelivered=redelivered, fresh=fresh)


@shared_task(name=beat.PURGE_TASK, acks_late=False)
def purge_task() -> None:
    # Early ack: a lost tick is made up by the next one; a repeated one finds less to delete.
    days = settings.AGENTFLOW_RETENTION_DAYS
    if not days:
        return  # 0 keeps everything (a tick scheduled before the setting changed)
    deleted = store.runs_purge(
        older_than=timedelta(days=days), max_batches=RETENTION_BATCHES_PER_TICK
    )
    if deleted.runs:
        logger.info("retention: deleted %s (older than %d days)", deleted.describe(), days)
    for part in features.retention_parts():  # the features' own rows (the schedules' slots)
        count = part.run(timedelta(days=days))
        if count:
            logger.info("retention: deleted %d %s (older than %d days)", count, part.what, days)


@celeryd_after_setup.connect
def _consume_this_builds_queue(sender: Any, instance: Any, **kwargs: Any) -> None:
    """A worker that takes step messages also consumes its build's own queue
    (docs/deploys.md, "Builds"), where runs that finish on this build are sent; whatever `-Q` said.
    Celery's documented way to add a queue every worker of a kind consumes (`celeryd_after_setup`,
    after `-Q` is applied). A worker that consumes no step queue (`-Q emails`) runs no steps and is
    left alone."""
    queues = instance.app.amqp.queues
    if dispatch.shared_queue(instance.app) not in queues.consume_from:
        return
    own = builds.queue(builds.current())
    queues.select_add(own)
    instance._agentflow_build_queue = own  # for worker_ready, in this same process


@worker_ready.connect
def _join_the_roster(sender: Any, **kwargs: Any) -> None:
    """Live workers of this build are counted from here (routing sends a pinned run's step to
    its build's queue only while one is alive), and runs held for this build go now."""
    worker = getattr(sender, "controller", None)
    queue = getattr(worker, "_agentflow_build_queue", None)
    if queue is not None:
        roster.join(queue)


@worker_shutdown.connect
def _leave_the_roster(**kwargs: Any) -> None:
    roster.leave()


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


@worker_ready.connect
def _forget_finished_time_limits(sender: Any, **kwargs: Any) -> None:
    """Drop finished tasks' time limits from the worker's timer every 10 s, not when they fall due.

    The prefork pool arms a timer entry in the worker's parent for each task's soft time limit
    (a step's: 240 s). A task that finishes only marks its entry cancelled, and kombu's timer
    keeps a cancelled entry in its heap until it falls due (celery/celery#1129 and #5200, closed
    unfixed). So the parent held every task of the last four minutes, about 550 bytes each:
    +11 MiB at 90 tasks a second, and ten times that at 900. Swept, it holds ten seconds' worth.
    """
    hub = getattr(getattr(sender, "controller", None), "hub", None)
    timer = getattr(hub, "timer", None)
    if hub is not None and isinstance(getattr(timer, "_queue", None), list):
        hub.call_repeatedly(TIME_LIMIT_SWEEP_SECONDS, drop_cancelled, timer)


def drop_cancelled(timer: Any) -> None:
    """Rebuild a kombu timer's heap without its cancelled entries, in place: the worker's event
    loop holds that very list."""
    queue = timer._queue
    live = [item for item in queue if not item.entry.canceled]
    if len(live) < len(queue):
        heapq.heapify(live)
        queue[:] = live
