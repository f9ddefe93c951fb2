"""Publishing step messages: the broker is a doorbell, never the state of record."""

from __future__ import annotations

import json
import logging
from functools import cache
from typing import Any

from celery import current_app
from celery.utils import uuid
from django.db import transaction

from agentflow.registry import Workflow
from agentflow.states import CLAIMED_KINDS, StepKind

logger = logging.getLogger(__name__)

RUN_STEP_TASK = "agentflow.run_step"
_NO_INPUT: Any = object()
#: Retry delays up to this go out as a Celery countdown too; longer ones only wait in Postgres
#: for the sweeper (a long countdown sits unacked in worker memory and can loop past the
#: visibility timeout).
MAX_COUNTDOWN_SECONDS = 30.0


#: `[workflow, version, step]`: the publisher has just moved the run onto this claimed step;
#: `[workflow, version, step, {"input": …}]`: onto this read step, of a run with that input.
Fresh = list[Any]
#: A read step's hint carries the run's input up to this size (JSON), so the worker runs the
#: step and records it in one statement without loading the run; a larger input is loaded.
FRESH_INPUT_MAX_BYTES = 4096
#: Steps carried in a hint: a claim for these, or, with the input, the whole of a read step.
_HINTED = (*CLAIMED_KINDS, StepKind.READ)


def fresh_hint(workflow: Workflow, step: str, *, input: Any = _NO_INPUT) -> Fresh | None:
    """The hint that lets the worker claim `step` while it loads the run (see
    `store.state_load_claiming`), or, for a read step and with the run's `input`, run the step
    before loading anything (`runtime`, `store.unclaimed_complete(assumed=True)`); None for
    other steps, or when there is nothing to gain."""
    found = workflow.steps.get(step)
    # A step that may wait (for approval) is neither claimed nor run on load: its wait comes first.
    if found is None or found.kind not in _HINTED or found.waits_for is not None:
        return None
    hint: Fresh = [workflow.name, workflow.version, step]
    if found.kind in CLAIMED_KINDS:
        return hint
    if found.compensation_only or input is _NO_INPUT:
        return None  # a compensation's state is more than the input: it is loaded
    if len(json.dumps(input)) > FRESH_INPUT_MAX_BYTES:
        return None
    return [*hint, {"input": input}]


def send_step(
    run_id: str, seq: int, *, countdown: float | None = None, fresh: Fresh | None = None
) -> bool:
    """Publish now. A broker error is logged, not raised: the run's `wake_at` lets the sweeper
    publish it again, so a lost doorbell costs latency, never the run. `fresh` is only a hint:
    a stale or wrong one costs the worker nothing but the round trip it was meant to save."""
    args = [run_id, seq]
    kwargs = {"fresh": fresh} if fresh is not None else {}
    try:
        _publish(args, kwargs, countdown)
    except Exception as exc:  # kombu raises OperationalError and friends
        logger.warning("could not enqueue %s step %s (%s); the sweeper will", run_id, seq, exc)
        return False
    return True


def _publish(args: list[Any], kwargs: dict[str, Any], countdown: float | None) -> None:
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
    with app.producer_or_acquire() as producer:
        app.amqp.send_task_message(producer, RUN_STEP_TASK, message, **_route(app))


@cache
def _route(app: Any) -> dict[str, Any]:
    """The options `send_task` routes `run_step` with (task_routes, else the default queue),
    once per app."""
    return dict(app.amqp.router.route({}, RUN_STEP_TASK))


def send_step_on_commit(
    run_id: str, seq: int, *, countdown: float | None = None, fresh: Fresh | None = None
) -> None:
    transaction.on_commit(lambda: send_step(run_id, seq, countdown=countdown, fresh=fresh))
