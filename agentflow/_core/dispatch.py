"""Publishing step messages: the broker is a doorbell, never the state of record."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import nullcontext
from functools import cache
from typing import Any

from celery import current_app
from celery.utils import uuid
from django.db import transaction

from agentflow import _priority
from agentflow._base.states import CLAIMED_KINDS
from agentflow._core import origin
from agentflow._core.registry import Workflow
from agentflow.models import WorkflowRun

logger = logging.getLogger("agentflow.dispatch")  # the name hosts' LOGGING knows

RUN_STEP_TASK = "agentflow.run_step"
#: Retry delays up to this go out as a Celery countdown too; longer ones only wait in Postgres
#: for the sweeper (a long countdown sits unacked in worker memory and can loop past the
#: visibility timeout).
MAX_COUNTDOWN_SECONDS = 30.0


#: `[workflow, version, step]`: the publisher has just moved the run onto this claimed step.
Fresh = list[str | int]


def member_hint(workflow: Workflow, batch: str) -> Fresh:
    """The mark of a batch member's own message (its countdown after a partner wait or a
    retry): `[workflow, version, <the batch's step>]`. The first position's message is the
    batch's doorbell (it publishes the unrecorded members again) unless it carries this, so
    a member waking from its own wait never runs a sibling that is still running a second
    time. An agent run's load takes no claim from a hint, so the mark costs nothing there."""
    return [workflow.name, workflow.version, batch]


def fresh_hint(workflow: Workflow, step: str) -> Fresh | None:
    """The hint that lets the worker claim `step` while it loads the run (see
    `store.state_load_claiming`); None for steps that take no claim.

    A read step gets none: docs/protocol.md, "One step, in order", step 2 says a cancelled run does
    no work, and only its load can tell (a read run straight from its message ran after an
    operator's cancel)."""
    found = workflow.steps.get(step)
    # A step that may wait (for approval) is never claimed on load: its wait comes first.
    if found is not None and found.kind in CLAIMED_KINDS and found.waits_for is None:
        return [workflow.name, workflow.version, step]
    return None


def send_step(
    run_id: str,
    seq: int,
    *,
    countdown: float | None = None,
    fresh: Fresh | None = None,
    queue: str | None = None,
    priority: _priority.Priority = _priority.OF_RUN,
) -> bool:
    """Publish now. A broker error is logged, not raised: the run's `wake_at` lets the sweeper
    publish it again, so a lost doorbell costs latency, never the run. `fresh` is only a hint:
    a stale or wrong one costs the worker nothing but the round trip it was meant to save.
    `queue`: a build's own queue (`builds.queue`), as `agentflow._builds.routing` decided; None, the
    shared one that `run_step` is routed to. `priority`: the run's (None: it has none), read
    from its row when not given, so every message of a run carries it."""
    args = [run_id, seq]
    kwargs = {"fresh": fresh} if fresh is not None else {}
    try:
        _publish(args, kwargs, countdown, queue, _resolved(run_id, priority))
    except Exception as exc:  # kombu raises OperationalError and friends
        logger.warning("could not enqueue %s step %s (%s); the sweeper will", run_id, seq, exc)
        return False
    return True


def _resolved(run_id: str, priority: _priority.Priority) -> int | None:
    """The run's priority, read from its row for a publisher that did not load it (off the
    step's own path). A read that fails costs the message its priority, never the message."""
    if priority is not _priority.OF_RUN:
        return priority
    try:
        return WorkflowRun.objects.filter(pk=run_id).values_list("priority", flat=True).first()
    except Exception as exc:  # no database here (a test, a shell), or it is down
        logger.info("published %s without its priority: %s", run_id, exc)
        return None


def _publish(
    args: list[Any],
    kwargs: dict[str, Any],
    countdown: float | None,
    queue: str | None = None,
    priority: int | None = None,
) -> None:
    """`app.send_task` for a step message, without the per-call work it cannot skip.

    A step is one message, so publishing is a third of a step's time in the worker, and
    `send_task` spends nearly as much on routing, option merging and its result object as
    on the broker round trip. This builds Celery's own protocol-2 message (`as_task_v2`) and
    hands it to Celery's own sender with the task's route, resolved once per process: the
    same queue, exchange, declare, delivery mode, retry policy and publish signals. Step
    messages are not children of the running task, and their reprs are plain (`saferepr`
    of two ids costs more than the rest).
    """
    app = current_app._get_current_object()  # the host's (or `-A`) app: its broker and routes
    with app.producer_or_acquire() as producer:
        _publish_on(producer, app, args, kwargs, countdown, queue, priority)


def _publish_on(
    producer: Any,
    app: Any,
    args: list[Any],
    kwargs: dict[str, Any],
    countdown: float | None,
    queue: str | None,
    priority: int | None = None,
) -> None:
    message = app.amqp.as_task_v2(
        uuid(),
        RUN_STEP_TASK,
        args=args,
        kwargs=kwargs,
        countdown=countdown,
        argsrepr=repr(args),
        kwargsrepr=repr(kwargs),
        ignore_result=True,
    )
    stamp = origin.database()
    if stamp:  # so a worker of another deployment can tell it is not its own
        message.headers[origin.HEADER] = stamp
    route = _route(app, queue)
    if _declared(producer, route):
        # kombu would bind a copy of the queue to the channel only to find it in this same
        # cache: a tenth of a publish's time.
        route = {**route, "declare": []}
    if priority is not None:
        route = {**route, "priority": _priority.on_message(producer.connection, priority)}
    app.amqp.send_task_message(producer, RUN_STEP_TASK, message, **route)


def send_steps(steps: Sequence[tuple[str, int, Fresh | None, str | None, int | None]]) -> bool:
    """Publish many step messages now, each (run id, seq, fresh, queue, priority):
    `start_many`'s first steps. One producer for all, and where kombu batches publishes
    (`Producer.batch`, the Redis transport: one pipelined round trip per thousand instead of one
    each) a batch. As `send_step`, a broker error is logged, not raised: the runs' `wake_at`
    lets the sweeper publish what was not."""
    app = current_app._get_current_object()
    try:
        with app.producer_or_acquire() as producer:
            batch = getattr(producer, "batch", None)  # kombu 5.7 and later
            with batch() if batch is not None else nullcontext():
                for run_id, seq, fresh, queue, priority in steps:
                    kwargs = {"fresh": fresh} if fresh is not None else {}
                    _publish_on(producer, app, [run_id, seq], kwargs, None, queue, priority)
    except Exception as exc:  # kombu raises OperationalError and friends
        logger.warning("could not enqueue %d steps (%s); the sweeper will", len(steps), exc)
        return False
    return True


@cache
def _route(app: Any, queue: str | None = None) -> dict[str, Any]:
    """The options `send_task` routes `run_step` with (task_routes, else the default queue),
    once per app; for a build's `queue`, that queue as Celery makes any missing one (a direct
    exchange of its name), never the shared route's exchange and routing key."""
    if queue:
        return {"queue": app.amqp.queues.new_missing(queue)}
    return dict(app.amqp.router.route({}, RUN_STEP_TASK))


def shared_queue(app: Any) -> str:
    """The name of the queue every worker takes step messages from."""
    queue = _route(app).get("queue")
    return str(getattr(queue, "name", queue))


def _declared(producer: Any, route: dict[str, Any]) -> bool:
    """Has kombu already declared the step queue on this producer's connection? Its own cache
    (`declared_entities`, emptied when the connection is lost), keyed as kombu keys it."""
    queue = route.get("queue")
    declared = getattr(producer.connection, "declared_entities", None)
    return (
        declared is not None
        and getattr(queue, "can_cache_declaration", False)
        and hash(queue) in declared
    )


def send_step_on_commit(
    run_id: str,
    seq: int,
    *,
    countdown: float | None = None,
    fresh: Fresh | None = None,
    queue: str | None = None,
    priority: _priority.Priority = _priority.OF_RUN,
) -> None:
    transaction.on_commit(
        lambda: send_step(
            run_id, seq, countdown=countdown, fresh=fresh, queue=queue, priority=priority
        )
    )
