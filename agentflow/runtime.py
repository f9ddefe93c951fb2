"""Replay-or-execute one step of a run (SPEC §3.3): the order of operations is the protocol."""

from __future__ import annotations

import logging
import random
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone

from agentflow import dispatch, faults, leases, registry, store, telemetry
from agentflow.context import StepContext
from agentflow.exceptions import OutcomeUnknown, PermanentStepError, RetryableStepError
from agentflow.models import RunEvent
from agentflow.registry import StepDef, Workflow
from agentflow.serialization import NotJSONError, to_json
from agentflow.states import ACTIVE_RUN_STATUSES, CLAIMED_KINDS, RunStatus, StepKind, StepStatus

logger = logging.getLogger(__name__)


def run_step(
    run_id: str, seq: int, *, redelivered: bool = False, fresh: dispatch.Fresh | None = None
) -> None:
    """Handle one `run_step` message. Safe to call any number of times for the same step.

    `redelivered`: the broker gave this message back because its consumer died.
    `fresh`: the publisher's hint that the run was just moved onto this (claimed) step.
    """
    _drop_broken_connection()
    run, claim = _load(run_id, seq, fresh)
    if run is None:
        logger.warning("run %s does not exist; dropping its message", run_id)
        return
    if run.status not in ACTIVE_RUN_STATUSES:
        return  # terminal, cancelled or parked: nothing to do
    if seq < run.current_seq:
        # Done already. A crash right after the completion commit loses the successor's
        # message: republish it for that crash's redelivery, or when the run is overdue. A plain
        # duplicate must not, or it rides along to the run's end, one extra message per step.
        if redelivered or (run.wake_at is not None and run.wake_at <= timezone.now()):
            dispatch.send_step(run.id, run.current_seq)
        return
    if seq > run.current_seq:
        return
    if run.status == RunStatus.WAITING and run.wake_at is not None:
        retry_at = run.wake_at - store.enqueue_grace()  # see store.runs._wait_txn
        if retry_at > timezone.now() + timedelta(seconds=0.5):
            return  # an early duplicate during back-off; the retry's own message comes later
    workflow = registry.lookup(run.workflow, run.version)
    if workflow is None:
        _park_for_version(run)
        return
    step = workflow.steps.get(run.current_step)
    if step is None:
        store.run_park(
            run.id,
            f"step {run.current_step!r} is not in {run.workflow} v{run.version}",
            kind=RunEvent.Kind.VERSION_MISMATCH,
        )
        return
    seen = run.checkpoint
    if seen is not None and seen.name != step.name:
        store.run_park(
            run.id,
            f"non-deterministic definition: step {seq} was recorded as {seen.name!r} "
            f"but the definition now says {step.name!r}",
            kind=RunEvent.Kind.VERSION_MISMATCH,
        )
        return
    if step.kind in CLAIMED_KINDS:
        _run_claimed(run, workflow, step, seq, seen, claim)
        return
    if redelivered:
        if seen is not None and seen.attempts >= settings.AGENTFLOW_MAX_ATTEMPTS:
            store.run_park(run.id, f"{step.name} killed its worker {seen.attempts} times")
            return
        store.attempt_lost(run.id, step, seq, seen)
        run = store.state_load(run_id, seq) or run
        seen = run.checkpoint
    _run_unclaimed(run, workflow, step, seq, seen)


def _load(
    run_id: str, seq: int, fresh: dispatch.Fresh | None
) -> tuple[store.StepState | None, store.Claim | None]:
    """The run's state at `seq`; for a fresh effect step also its claim, in the same statement:
    exactly the claim `store.step_claim` would commit after the checks in `run_step`, which
    then hold by construction."""
    if fresh is not None:
        name, version, step_name = fresh
        workflow = registry.lookup(str(name), int(version))
        step = workflow.steps.get(str(step_name)) if workflow is not None else None
        if workflow is not None and step is not None and step.kind in CLAIMED_KINDS:
            return store.state_load_claiming(run_id, seq, workflow, step)
    return store.state_load(run_id, seq), None


def _drop_broken_connection() -> None:
    """Close the connection only if an error left it unusable.

    Unlike close_old_connections(), this does not re-arm Django's health check, which would
    cost a `SELECT 1` round trip on every step.
    """
    if connection.connection is not None and connection.errors_occurred:
        if connection.is_usable():
            connection.errors_occurred = False
        else:
            connection.close()


def _context(run: store.StepState, step: StepDef, seq: int, attempt: int) -> StepContext:
    telemetry.step_started(
        run_id=run.id,
        workflow=run.workflow,
        seq=seq,
        step=step.name,
        kind=step.kind,
        attempt=attempt,
    )
    return StepContext(
        run_id=run.id,
        workflow=run.workflow,
        seq=seq,
        step=step.name,
        attempt=attempt,
        input=run.input,
        load_outputs=lambda: store.outputs_load(run.id, seq),
    )


def _run_claimed(
    run: store.StepState,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    seen: store.CheckpointRow | None,
    claim: store.Claim | None,
) -> None:
    """effect / llm: claim committed, then the call, then the fenced completion."""
    if claim is None:
        claim = _claim(run, step, seq, seen)
    if claim is None:
        return  # lost the race, someone holds a live lease, or the run was parked
    ctx = _context(run, step, seq, claim.attempt)
    faults.crash_point(step.name, "after_claim", claim.attempt)
    try:
        with leases.kept_alive(
            renew=lambda: store.lease_renew(run.id, seq, claim.attempt),
            on_lost=ctx.mark_lease_lost,
        ):
            output = _produce(step, ctx, claim)
    except _Parked:
        return
    except NotJSONError as exc:
        # The call returned, so its effect may stand: failing the run would skip the step's
        # compensation (it never completed). An operator decides instead.
        store.run_park(
            run.id, f"{step.name} ran but its result cannot be recorded ({exc}); check the partner"
        )
        return
    except Exception as exc:
        _record_failure(run, workflow, step, seq, claim.attempt, exc, claimed=True)
        return
    faults.crash_point(step.name, "after_effect", claim.attempt)
    if not store.step_complete(run, workflow, step, seq, claim.attempt, output):
        logger.warning("%s step %s: fenced out, result discarded", run.id, seq)


def _claim(
    run: store.StepState, step: StepDef, seq: int, seen: store.CheckpointRow | None
) -> store.Claim | None:
    if (
        seen is not None
        and seen.status == StepStatus.IN_PROGRESS
        and seen.attempts >= settings.AGENTFLOW_MAX_ATTEMPTS
    ):
        # Bounds the redelivery loop of a step that kills its worker every time.
        if store.claim_blocker(seen, timezone.now()) is None:
            store.run_park(
                run.id,
                f"{step.name} was attempted {seen.attempts} times without finishing "
                "(the worker kept dying); check the partner before retrying",
            )
        return None
    return store.step_claim(run, step, seq, seen)


class _Parked(Exception):
    """The run was parked for an operator; nothing more to do for this message."""


def _produce(step: StepDef, ctx: StepContext, claim: store.Claim) -> Any:
    """Reconcile an unknown outcome, apply the key-age guard, or run the step."""
    too_old = step.key_window_seconds is not None and (
        timezone.now() - claim.first_started_at
    ) > timedelta(seconds=step.key_window_seconds)
    if (claim.outcome_unknown or too_old) and step.reconcile is not None:
        try:
            found = step.reconcile(ctx)
        except OutcomeUnknown:
            if too_old:
                store.run_park(
                    ctx.run_id,
                    f"{step.name}: first attempt is older than the partner's idempotency window "
                    f"({step.key_window_seconds:.0f} s) and the partner could not say whether it "
                    "happened; retrying blindly could repeat the effect",
                )
                raise _Parked from None
            found = None  # inside the window the idempotency key still protects the retry
        if found is not None:
            output = to_json(found, f"reconcile of {step.name}")
            store.event_add(
                ctx.run_id,
                RunEvent.Kind.RECONCILED,
                f"{step.name}: effect found at the partner; adopted, not repeated",
            )
            return output
    elif too_old:
        store.run_park(
            ctx.run_id,
            f"{step.name}: first attempt is older than the partner's idempotency window "
            f"({step.key_window_seconds:.0f} s) and there is no way to ask the partner what "
            "happened; retrying blindly could repeat the effect",
        )
        raise _Parked
    return to_json(step.fn(ctx), f"output of step {step.name}")


def _run_unclaimed(
    run: store.StepState,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    seen: store.CheckpointRow | None,
) -> None:
    """read: run, then one commit. db: run and commit together, under the run's row lock."""
    attempt = seen.attempts + 1 if seen else 1
    ctx = _context(run, step, seq, attempt)
    try:
        if step.kind == StepKind.DB:
            _run_db_step(run, workflow, step, seq, ctx)
            return
        output = to_json(step.fn(ctx), f"output of step {step.name}")
        faults.crash_point(step.name, "after_effect", attempt)
        try:
            store.unclaimed_complete(run, workflow, step, seq, seen, output)
        except IntegrityError:
            return  # only our own rows are written here: another worker recorded it first
    except store.Fenced:
        return
    except Exception as exc:
        _record_failure(run, workflow, step, seq, attempt, exc, claimed=False)


def _run_db_step(
    run: store.StepState, workflow: Workflow, step: StepDef, seq: int, ctx: StepContext
) -> None:
    """The step's writes and its COMPLETED checkpoint commit together, so they happen once.

    The run row stays locked meanwhile: a racing duplicate waits, then finds the step done.
    """
    with transaction.atomic():
        locked = store.state_load(run.id, seq, lock=True)
        if locked is None or locked.status not in ACTIVE_RUN_STATUSES or locked.current_seq != seq:
            return
        seen = locked.checkpoint
        if seen is not None and seen.status == StepStatus.COMPLETED:
            return
        output = to_json(step.fn(ctx), f"output of step {step.name}")
        faults.crash_point(step.name, "after_effect", ctx.attempt)
        if not store.unclaimed_complete(run, workflow, step, seq, seen, output):
            raise store.Fenced  # rolls the step's own writes back too


def _record_failure(
    run: store.StepState,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    attempt: int,
    exc: Exception,
    *,
    claimed: bool,
) -> None:
    delay: float | None
    if isinstance(exc, PermanentStepError | NotJSONError):
        delay, message = None, str(exc)
    elif isinstance(exc, RetryableStepError | OperationalError):
        message = str(exc) or type(exc).__name__
        if step.retry.exhausted(attempt):
            delay, message = None, f"gave up after {attempt} attempts: {message}"
        else:
            delay = step.retry.delay_seconds(attempt, rng=random.Random())
            if isinstance(exc, RetryableStepError) and exc.retry_after_seconds:
                delay = max(delay, exc.retry_after_seconds)
    else:
        # A bug in a step is not transient: fail with a readable reason instead of looping.
        logger.exception("%s step %s (%s) raised", run.id, seq, step.name)
        delay, message = None, f"unexpected {type(exc).__name__}: {exc}"
    if delay is None:
        logger.warning("%s step %s (%s) failed permanently: %s", run.id, seq, step.name, message)
    store.step_fail(
        run,
        workflow,
        step,
        seq,
        attempt=attempt,
        claimed=claimed,
        error=message,
        retry_in_seconds=delay,
    )


def _park_for_version(run: store.StepState) -> None:
    try:
        deployed = f"this code has v{registry.latest(run.workflow).version}"
    except Exception:
        deployed = "this code has no such workflow"
    store.run_park(
        run.id,
        f"definition changed under a running run: it started on {run.workflow} v{run.version}, "
        f"{deployed}; resuming could replay steps that no longer match their checkpoints",
        kind=RunEvent.Kind.VERSION_MISMATCH,
    )
