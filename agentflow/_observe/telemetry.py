"""The engine's observation points: one call each from the engine, fanned out to metrics, logs
and traces, so the engine's own modules carry a line per point and nothing more.

Counters move only after the transaction that made the fact true commits (a rolled-back
retry is not a retry). Per step this costs about 10 µs (context binding and one histogram
observation); an attempt that went to plan logs at DEBUG, so no line is formatted for it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from celery import current_app
from celery.signals import beat_init, worker_process_init
from django.db import transaction

from agentflow import logs
from agentflow._base.context import idempotency_key
from agentflow._conf import settings
from agentflow._core import dispatch, leases, origin
from agentflow._observe import metrics, tracing
from agentflow.exceptions import PermanentStepError, RetryableStepError
from agentflow.models import WorkflowRun

logger = logging.getLogger("agentflow.steps")
broker_logger = logging.getLogger("agentflow.broker")
run_logger = logging.getLogger("agentflow.runs")
sweep_logger = logging.getLogger("agentflow.sweeper")

#: Events that mark the attempt's span as failed (the runtime handles the error itself, so
#: the span never sees the exception).
_FAILED_ATTEMPT = frozenset({"attempt_failed", "outcome_unknown", "needs_attention"})

#: An attempt this slow gets an INFO line even when nothing else happened to it.
SLOW_STEP_SECONDS = 5.0

#: Run ids listed in full in a sweep's text message; the JSON line's `run_ids` has them all.
SWEEP_IDS_SHOWN = 20


class _Message:
    """What the worker learned while handling one step message."""

    __slots__ = (
        "events",
        "key",
        "kind",
        "log_tokens",
        "origin",
        "parent",
        "replayed",
        "run_id",
        "span",
        "started",
        "step",
        "workflow",
    )

    def __init__(self, run_id: str, parent: Any, origin: str | None = None) -> None:
        self.run_id = run_id
        self.parent = parent
        #: The database its publisher stamped on it (`agentflow._core.origin`), if any.
        self.origin = origin
        self.started: float | None = None
        self.workflow = self.step = self.kind = self.key = ""
        self.span: tracing.StepSpan | None = None
        self.events: list[str] = []
        self.log_tokens: logs.Tokens | None = None
        #: An agent run's replay before this step: calls and model turns handed back from
        #: checkpoints, and the tokens those turns did not spend again.
        self.replayed: dict[str, int] = {}


_message: ContextVar[_Message | None] = ContextVar("agentflow_step_message", default=None)


@contextmanager
def step_message(run_id: str, seq: int, request: Any = None) -> Iterator[None]:
    """Around one `run_step` message in the worker: binds the run to every line logged while
    it is handled and, if a step ran (`step_started`), times it, logs it and ends its span."""
    parent = tracing.message_context(request) if tracing.enabled() else None
    message = _Message(run_id, parent, origin.of(request))
    tokens = logs.bind(run_id=run_id, seq=seq)
    token = _message.set(message)
    error: BaseException | None = None
    try:
        yield
    except BaseException as exc:
        error = exc
        raise
    finally:
        _message.reset(token)
        try:
            _step_finished(message, error)
        finally:
            if message.log_tokens is not None:
                logs.unbind(message.log_tokens)
            logs.unbind(tokens)


def step_started(
    *, run_id: str, workflow: str, seq: int, step: str, kind: str, attempt: int
) -> None:
    """The runtime is about to run `step` (its attempt is known, a claim taken if it needs one)."""
    message = _message.get()
    if message is None or message.started is not None:
        return  # outside a worker's message (a test calling the runtime), or already started
    message.started = time.perf_counter()
    message.workflow, message.step, message.kind = workflow, step, str(kind)
    message.key = idempotency_key(run_id, seq)
    message.log_tokens = logs.bind(
        workflow=workflow,
        step=step,
        attempt=attempt,
        idempotency_key=message.key,
        owner=leases.owner_token() or f"{settings.AGENTFLOW_HOSTNAME}/{os.getpid()}",
    )
    if tracing.enabled():
        parent = message.parent or _stored_context(run_id)
        message.span = tracing.StepSpan(
            run_id,
            step,
            parent,
            workflow=workflow,
            seq=seq,
            attempt=attempt,
            kind=str(kind),
            idempotency_key=message.key,
            **message.replayed,
        )
        if message.replayed.get("replayed_calls"):
            # The replay is visible as such: its turns made no request (no span of their own).
            message.span.event("replayed from checkpoints", values=message.replayed)


def _stored_context(run_id: str) -> Any:
    """The run's first context, as its row keeps it (written by the store, read here)."""
    stored = WorkflowRun.objects.filter(pk=run_id).values_list("trace_parent", flat=True).first()
    return tracing.context_from(stored)


def _step_finished(message: _Message, error: BaseException | None) -> None:
    if message.started is None:
        return
    seconds = time.perf_counter() - message.started
    metrics.STEP_SECONDS.labels(message.workflow, message.step, message.kind).observe(seconds)
    if message.span is not None:
        message.span.end(error)
    # An attempt that went to plan is on the histogram and in the admin; its line is DEBUG
    # (a log line costs a step more than all the rest of this). Retries, takeovers, reconciles
    # and slow attempts are news: INFO.
    notable = message.events or error is not None or seconds >= SLOW_STEP_SECONDS
    level = logging.INFO if notable else logging.DEBUG
    if logger.isEnabledFor(level):
        logger.log(
            level,
            "step %s took %.1f ms%s",
            message.step,
            seconds * 1000,
            f" ({', '.join(message.events)})" if message.events else "",
            extra={"duration_ms": round(seconds * 1000, 3), **_if_any(events=message.events)},
        )


def _if_any(**fields: Any) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value}


# --- step messages of another deployment -----------------------------------------------------
#: A process tells of step messages for runs its database does not know at most once in this
#: long: two deployments sharing a queue swap hundreds of them, and the line counts them all.
STRAY_WARNING_SECONDS = 300.0


class _Strays:
    """What this process took since it last said so."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.publishers: set[str] = set()
        self.told_at: float | None = None


_strays = _Strays()


def unknown_run(run_id: str) -> None:
    """The step message being handled names a run this database does not know. Stamped with
    this very database, the run was deleted here after its message went out (retention, a
    delete). Otherwise another deployment most likely consumes the same broker database and
    queue: each takes the other's step messages, finds no such run and drops them, and their
    runs move only when their own sweeper publishes them again. Counted by who published it,
    and told at WARNING at most once every `STRAY_WARNING_SECONDS` (docs/operating.md, "Two
    deployments on one broker")."""
    message = _message.get()
    own = origin.database()
    if message is None or (message.origin is not None and message.origin == own):
        logger.warning("run %s does not exist; dropping its message", run_id)
        return
    publisher = message.origin
    metrics.STRAY_STEP_MESSAGES.labels("another_deployment" if publisher else "unstamped").inc()
    now = time.monotonic()
    with _strays.lock:
        _strays.count += 1
        _strays.publishers.add(f"database {publisher}" if publisher else "an unstamped publisher")
        if _strays.told_at is not None and now - _strays.told_at < STRAY_WARNING_SECONDS:
            return
        count, publishers, told_at = _strays.count, sorted(_strays.publishers), _strays.told_at
        _strays.count, _strays.publishers, _strays.told_at = 0, set(), now
    since = "" if told_at is None else f" in the last {now - told_at:.0f} s"
    broker_logger.warning(
        "%d step message%s for runs this database (%s) does not know reached this worker%s "
        "(run %s; published by %s): another deployment most likely consumes the same broker "
        "database and queue (%r). Each takes the other's step messages and drops them, so their "
        "runs move only when their own sweeper publishes them again. Give each deployment a "
        "broker database or vhost, or a queue, of its own",
        count,
        "" if count == 1 else "s",
        own or "unnamed",
        since,
        run_id,
        " and ".join(publishers),
        dispatch.shared_queue(current_app._get_current_object()),
    )


# --- runs -----------------------------------------------------------------------------------
def run_started(run_id: str, workflow: str, *, keep_trace: Callable[[str, str], None]) -> None:
    """A new run exists (in the caller's transaction): count and log it once that commits, and
    if tracing is on hand its trace context to `keep_trace(run_id, traceparent)`, the store's
    writer, which keeps it on the row (the store reports through this module, so it is handed
    in rather than imported)."""
    if tracing.enabled():
        keep_trace(run_id, tracing.run_started(run_id, workflow))

    def committed() -> None:
        metrics.RUNS_STARTED.labels(workflow).inc()
        with logs.bound(run_id=run_id, workflow=workflow):
            run_logger.info("run %s of %s started", run_id, workflow)

    transaction.on_commit(committed)


def run_finished(run_id: str, workflow: str, status: str) -> None:
    """The store moved a run to COMPLETED, FAILED or CANCELLED in the current transaction."""

    def committed() -> None:
        metrics.RUNS_FINISHED.labels(workflow, str(status)).inc()
        with logs.bound(run_id=run_id, workflow=workflow):
            run_logger.info("run %s %s", run_id, str(status).lower())

    transaction.on_commit(committed)


def event_recorded(run_id: str, kind: str) -> None:
    """`store.event_add` wrote an event (in the current transaction)."""
    kind = str(kind)
    message = _message.get()
    if message is not None and message.run_id == run_id:
        message.events.append(kind)
        if message.span is not None:
            message.span.event(kind, failed=kind in _FAILED_ATTEMPT)
    transaction.on_commit(lambda: metrics.RUN_EVENTS.labels(kind).inc())


# --- agent mode: what its replay handed back ----------------------------------------------
def replayed(*, calls: int, turns: int, tokens_saved: int) -> None:
    """An agent run's replay handed `calls` recorded calls back (`turns` of them model turns)
    before the call this message makes: its step's span says so (they make no spans)."""
    message = _message.get()
    if message is not None:
        message.replayed = {
            "replayed_calls": calls,
            "replayed_turns": turns,
            "tokens_saved": tokens_saved,
        }


# --- the sweeper ----------------------------------------------------------------------------
def sweep_finished(*, requeued: list[str], parked: list[str], query_ms: float) -> None:
    """One sweeper pass ended. Quiet when it found nothing; otherwise one INFO line saying how
    many runs and which."""
    metrics.SWEEPS.inc()
    if requeued:
        metrics.SWEEP_REQUEUED.inc(len(requeued))
    if not (requeued or parked):
        return
    shown = ", ".join(requeued[:SWEEP_IDS_SHOWN])
    more = f" and {len(requeued) - SWEEP_IDS_SHOWN} more" if len(requeued) > SWEEP_IDS_SHOWN else ""
    sweep_logger.info(
        "sweep re-published %d run(s)%s%s; parked %d; query %.1f ms",
        len(requeued),
        f": {shown}" if requeued else "",
        more,
        len(parked),
        query_ms,
        extra={
            "query_ms": round(query_ms, 3),
            **_if_any(run_ids=requeued, parked_run_ids=parked),
        },
    )


@beat_init.connect
def _beat_started(**kwargs: Any) -> None:
    """Beat's one line: everything else it does (a sweep tick every interval) is silent. The
    embedded beat of `worker -B` is a process of its own too: its lines say beat."""
    logs.set_process_kind("beat")
    logging.getLogger("agentflow.beat").info(
        "beat started: the recovery sweeper is due every %d s", settings.AGENTFLOW_SWEEP_INTERVAL
    )


@worker_process_init.connect
def _fold_the_dead(**kwargs: Any) -> None:
    """A new pool child usually replaces one that died: fold the dead one's metric file now,
    on its own host (the web, elsewhere, cannot tell whether this host's processes live)."""
    try:
        metrics.fold_dead()
    except OSError:
        logger.warning("could not fold dead processes' metric files", exc_info=True)


# --- partner calls --------------------------------------------------------------------------
@contextmanager
def partner_call(partner: str, operation: str) -> Iterator[None]:
    """Around one call to a partner: a client span carrying the step's run id, step and
    idempotency key, and the error count by partner and kind when it raises."""
    message = _message.get()
    attrs: dict[str, Any] = {}
    if message is not None and message.span is not None:
        attrs = {"run_id": message.run_id, "step": message.step, "idempotency_key": message.key}
    with tracing.partner_span(partner, operation, **attrs):
        try:
            yield
        except RetryableStepError:
            metrics.PARTNER_ERRORS.labels(partner, "retryable").inc()
            raise
        except PermanentStepError:
            metrics.PARTNER_ERRORS.labels(partner, "permanent").inc()
            raise
        except Exception:
            metrics.PARTNER_ERRORS.labels(partner, "unexpected").inc()
            raise
