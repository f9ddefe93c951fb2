"""Replay-or-execute one step of a run (docs/protocol.md, "One step, in order"): the order of
operations is the protocol.

This module takes a step message from load to the step's kind: read and db steps run here;
effect and llm steps are claimed here and carried out by `agentflow._engine.attempts`, which holds
the
rule for effects (docs/protocol.md, "Unknown outcomes"). A code-defined (agent) run between calls
or in a batch is handed to agent mode's step path (`CodeRuns`); its next call then runs here as
any step does.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Protocol

from django.db import IntegrityError, connection, transaction

from agentflow import _store as store
from agentflow._base import outcomes
from agentflow._base.context import StepContext, idempotency_key
from agentflow._base.states import (
    ACTIVE_RUN_STATUSES,
    CLAIMED_KINDS,
    RunStatus,
    StepKind,
    StepStatus,
)
from agentflow._builds import routing
from agentflow._concurrency import HOLD
from agentflow._core import builds, dispatch, faults, leases, pooler, registry
from agentflow._core.registry import NEXT_CALL, CodeDefined, StepDef, Workflow
from agentflow._core.serialization import NotJSONError, to_json
from agentflow._engine import context_loader
from agentflow._engine.attempts import (
    ClaimedAttempt,
    describe,
    log_raised,
    masked,
    retry_delay,
    transient,
)
from agentflow._limits import limiter
from agentflow._observe import telemetry
from agentflow._privacy import scope as privacy
from agentflow._waits import waits
from agentflow.conf import settings
from agentflow.exceptions import NeedsAttention, PartnerWait, PermanentStepError
from agentflow.models import RunEvent

logger = logging.getLogger("agentflow.runtime")  # the name hosts' LOGGING knows
CONCURRENCY_HOLD = HOLD + ":"


class CodeRuns(Protocol):
    """Agent mode's half of a step (`agentflow.agent.steps`), handed over when the app starts
    (`AgentflowConfig.ready`): a code-defined run between calls, or in a batch, goes there. The
    runtime imports none of it: a graph run never enters agent code."""

    def next_call(
        self,
        run: store.StepState,
        workflow: CodeDefined,
        seq: int,
        seen: store.CheckpointRow | None,
    ) -> StepDef | None:
        """Replay the run's function up to its next call: that call as this task's step, or
        None when the run was finished, failed, parked, or began a batch instead."""

    def batch_member(
        self,
        run: store.StepState,
        workflow: CodeDefined,
        seq: int,
        seen: store.CheckpointRow | None,
        span: tuple[int, int],
        *,
        redelivered: bool,
        own: bool,
    ) -> None:
        """Run and record the batch's member at `seq`."""


_code_runs: list[CodeRuns] = []


def serve_code_runs(runs: CodeRuns) -> None:
    """Code-defined runs' steps go to `runs` (agent mode's, `agentflow.agent.steps`)."""
    _code_runs[:] = [runs]


def _code() -> CodeRuns:
    if not _code_runs:
        raise RuntimeError("a code-defined run, and no step path for it: is agentflow ready?")
    return _code_runs[0]


def run_step(
    run_id: str, seq: int, *, redelivered: bool = False, fresh: dispatch.Fresh | None = None
) -> None:
    """Handle one `run_step` message. Safe to call any number of times for the same step.

    `redelivered`: the broker gave this message back because its consumer died.
    `fresh`: the publisher's hint that the run was just moved onto this (claimed) step.
    """
    # Its partner calls wait in this step's place; what it stores is sealed as its run's.
    with limiter.step_calls(run_id, seq), privacy.run_scope(run_id):
        _run_step(run_id, seq, redelivered=redelivered, fresh=fresh)


def _run_step(run_id: str, seq: int, *, redelivered: bool, fresh: dispatch.Fresh | None) -> None:
    _drop_broken_connection()
    run, claim = _load(run_id, seq, fresh)
    if run is None:
        telemetry.unknown_run(run_id)  # deleted here, or another deployment's message
        return
    if run.status not in ACTIVE_RUN_STATUSES:
        return  # terminal, cancelled or parked: nothing to do
    if seq < run.current_seq:
        # Done already. A crash right after the completion commit loses the successor's
        # message: republish it for that crash's redelivery, or when the run is overdue. A plain
        # duplicate must not, or it rides along to the run's end, one extra message per step.
        if redelivered or run.overdue:
            queue = builds.route(run.build, run.pinned)
            if queue is None:
                dispatch.send_step(run.id, run.current_seq, priority=run.priority)
            else:
                dispatch.send_step(run.id, run.current_seq, queue=queue, priority=run.priority)
        return
    if run.status == RunStatus.WAITING and run.hold.startswith(CONCURRENCY_HOLD):
        return  # not admitted by its concurrency key: a stray message (store.concurrency)
    span = run.batch
    if seq > run.current_seq and not (span is not None and span[0] <= seq <= span[1]):
        return
    # Which build's code runs this step (docs/deploys.md, "Builds"): free when it is this one's.
    admitted = routing.admit(run, seq)
    if admitted is None:
        return  # forwarded to its build's queue, held, or parked: nothing of it runs here
    run = admitted
    seen = run.checkpoint
    workflow = registry.lookup(run.workflow, run.version)
    if workflow is None:
        _park_for_version(run, seq, seen)
        return
    privacy.enter_run(run.id, workflow.personal)
    if span is not None and isinstance(workflow, CodeDefined):
        own = fresh is not None and len(fresh) == 3 and fresh[2] == run.current_step
        _code().batch_member(run, workflow, seq, seen, span, redelivered=redelivered, own=own)
        return
    in_flight = seen is not None and seen.status == StepStatus.IN_PROGRESS
    if isinstance(workflow, CodeDefined) and run.current_step == NEXT_CALL:
        if run.cancel_requested and not in_flight and not _settles_first(None, seen):
            store.cancel_begin(run.id, seq)
            return
        step = _code().next_call(run, workflow, seq, seen)
        if step is None:
            return  # finished, failed or parked by the replay
    else:
        step = workflow.step_named(run.current_step)
    if step is not None and step.key is None and run.branch:
        step = replace(step, key=idempotency_key(run.id, seq, run.branch))  # a compensation
    if step is None:
        store.run_park(
            run.id,
            seq,
            f"step {run.current_step!r} is not in {run.workflow} v{run.version}",
            kind=RunEvent.Kind.VERSION_MISMATCH,
            fence=seen.fence if seen else None,
        )
        return
    if seen is not None and seen.name != step.name:
        store.run_park(
            run.id,
            seq,
            f"non-deterministic definition: step {seq} was recorded as {seen.name!r} "
            f"but the definition now says {step.name!r}",
            kind=RunEvent.Kind.VERSION_MISMATCH,
            fence=seen.fence,
        )
        return
    # An operator asked: undo instead of going on. But if whether this effect happened is not
    # known, its claimed attempt first asks the partner (never making it), and the cancel
    # then undoes what it found.
    cancelling = run.cancel_requested and not step.compensation_only and not in_flight
    if cancelling and not _settles_first(step.kind, seen):
        store.cancel_begin(run.id, seq)
        return
    if step.waits_for is not None:
        settled = _settle_wait(run, workflow, step, seq, seen)
        if settled is None:
            return  # WAITING for its timer, signal or approval; or the run moved on
        step = settled
    if step.kind in CLAIMED_KINDS:
        _run_claimed(run, workflow, step, seq, seen, claim)
        return
    if redelivered:
        # Its worker died mid-step: count that attempt, and stop once the bound is reached.
        seen = store.attempt_lost(run.id, step, seq)
        if seen is None or seen.status == StepStatus.COMPLETED:
            return
        if seen.attempts >= settings.AGENTFLOW_MAX_ATTEMPTS:
            store.run_park(
                run.id,
                seq,
                f"{step.name} killed its worker {seen.attempts} times",
                fence=seen.fence,
            )
            return
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
        # Not for an agent run: after a fork its compensations' keys name the branch,
        # which this statement does not know.
        if (
            workflow is not None
            and not isinstance(workflow, CodeDefined)
            and step is not None
            and step.kind in CLAIMED_KINDS
            # A hint from a publisher that did not know the step waits: its wait comes first.
            and step.waits_for is None
        ):
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


def _settles_first(kind: str | None, seen: store.CheckpointRow | None) -> bool:
    """Must a cancel learn first whether the step at `seen` took effect
    (docs/protocol.md, "Operator actions")? `kind` None: a agent call not replayed yet, which may be
    an effect."""
    if seen is None:
        return False
    if kind is None:
        return seen.status == StepStatus.FAILED and seen.retryable
    return outcomes.unsettled(kind=kind, status=seen.status, retryable=seen.retryable)


def _settle_wait(
    run: store.StepState,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    seen: store.CheckpointRow | None,
) -> StepDef | None:
    """The step as its wait decided (see `agentflow._waits.waits`). A workflow's predicate or
    arguments function that raises fails the run with the reason, before anything acted (as a
    `read`: nothing of the step ran)."""
    try:
        return waits.settle(run, step, seq)
    except Exception as exc:
        if pooler.database_trouble(exc):
            raise  # the engine's own statement failed: the message is retried
        log_raised(logger, run.id, workflow, "%s step %s (%s): deciding its wait raised",
                   run.id, seq, step.name)  # fmt: skip
        why = f"deciding what it waits for raised {type(exc).__name__}: {exc}"
        if seen is not None and outcomes.unsettled(
            kind=seen.kind, status=seen.status, retryable=seen.retryable
        ):
            # Claimed before (approved, or then needing no approval): its effect may have
            # happened, which a failure would write off as never made
            # (docs/protocol.md, "Unknown outcomes", "I8: money").
            store.run_park(
                run.id,
                seq,
                f"outcome unknown: {step.name} may have taken effect, and {why}; fix that, "
                "then retry (it asks the partner first)",
                kind=RunEvent.Kind.OUTCOME_UNKNOWN,
                fence=seen.fence,
            )
            return None
        failed = PermanentStepError(why)
        unrun = replace(step, kind=StepKind.READ, waits_for=None)
        _record_unclaimed_failure(run, workflow, unrun, seq, seen, 1, failed)
        return None


# --- effect and llm steps: claim, call, fenced completion ----------------------------------------
def _run_claimed(
    run: store.StepState,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    seen: store.CheckpointRow | None,
    claim: store.Claim | None,
) -> None:
    if claim is None:
        claim = _claim(run, step, seq, seen)
    if claim is None:
        return  # lost the race, someone holds a live lease, not due yet, or the run was parked
    if claim.outcome_unknown:
        logger.info(
            "%s step %d %s: attempt %d takes over from a lost owner; asks the partner first",
            run.id, seq, step.name, claim.attempt,
        )  # fmt: skip
    ctx = context_loader.step_context(run, step, seq, claim.attempt)
    faults.crash_point(step.name, "after_claim", claim.attempt)
    attempt = ClaimedAttempt(run, workflow, step, seq, claim, ctx)
    with leases.kept_alive(
        renew=lambda conn: store.lease_renew(run.id, seq, claim.fence, conn=conn),
        on_lost=ctx.mark_lease_lost,
    ):
        attempt.run()


def _claim(
    run: store.StepState, step: StepDef, seq: int, seen: store.CheckpointRow | None
) -> store.Claim | None:
    if (
        seen is not None
        and seen.status == StepStatus.IN_PROGRESS
        and seen.attempts >= settings.AGENTFLOW_MAX_ATTEMPTS
        and seen.claimable
    ):
        # Bounds the redelivery loop of a step that kills its worker every time.
        store.run_park(
            run.id,
            seq,
            f"outcome unknown: {step.name} was attempted {seen.attempts} times without "
            "finishing (the worker kept dying); check the partner, then retry (it asks the "
            "partner first)",
            kind=RunEvent.Kind.OUTCOME_UNKNOWN,
            fence=seen.fence,
            data={"attempt": seen.attempts, "fence": seen.fence, "error": "worker kept dying"},
        )
        return None
    return store.step_claim(run, step, seq, seen)


# --- read and db steps: run, then one commit -----------------------------------------------------
def _run_unclaimed(
    run: store.StepState,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    seen: store.CheckpointRow | None,
) -> None:
    """read: run, then one commit. db: run and commit together, under the run's row lock."""
    if store.claim_blocker(seen) is not None:
        return  # a retry not yet due (an early duplicate), or a failure for good
    attempt = seen.attempts + 1 if seen else 1
    ctx = context_loader.step_context(run, step, seq, attempt)
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
    except PartnerWait as wait:
        # No turn at the partner: nothing of the step ran past its request; no attempt spent.
        store.step_wait_turn(
            run.id, seq, partner=wait.partner, why=str(wait), seconds=wait.wait_seconds, seen=seen
        )
    except Exception as exc:
        _record_unclaimed_failure(run, workflow, step, seq, seen, attempt, exc)


def _run_db_step(
    run: store.StepState, workflow: Workflow, step: StepDef, seq: int, ctx: StepContext
) -> None:
    """The step's writes and its COMPLETED checkpoint commit together, so they happen once.

    The run row stays locked meanwhile: a racing duplicate (or a redelivery counting a lost
    attempt) waits, then finds the step done.
    """
    with transaction.atomic():
        locked = store.state_load(run.id, seq, lock=True)
        if locked is None or locked.status not in ACTIVE_RUN_STATUSES or locked.current_seq != seq:
            return
        seen = locked.checkpoint
        if store.claim_blocker(seen) is not None:
            return
        output = to_json(step.fn(ctx), f"output of step {step.name}")
        faults.crash_point(step.name, "after_effect", ctx.attempt)
        # Fenced on the run as `run_step` found it when it chose this step (a cancel since then
        # moved the run on to undoing), not merely on the state it holds locked now.
        if not store.unclaimed_complete(run, workflow, step, seq, seen, output):
            raise store.Fenced  # rolls the step's own writes back too


def _record_unclaimed_failure(
    run: store.StepState,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    seen: store.CheckpointRow | None,
    attempt: int,
    exc: Exception,
) -> None:
    delay: float | None
    if isinstance(exc, NeedsAttention):  # the step asks for a person: park, with its reason
        store.run_park(run.id, seq, f"{step.name}: {exc}", fence=seen.fence if seen else None)
        return
    if isinstance(exc, PermanentStepError | NotJSONError):
        delay, message = None, str(exc)
    elif transient(exc):
        message = describe(exc)
        if step.retry.exhausted(attempt):
            if pooler.database_trouble(exc):
                # The database kept failing, not the step: an operator retries once it is back.
                store.run_park(
                    run.id,
                    seq,
                    f"{step.name}: the database kept failing (gave up after {attempt} "
                    f"attempts: {message}); retry once it is back",
                    fence=seen.fence if seen else None,
                )
                return
            delay, message = None, f"gave up after {attempt} attempts: {message}"
        else:
            delay = retry_delay(step, attempt, exc)
    else:
        # A bug in a step is not transient: fail with a readable reason instead of looping.
        log_raised(logger, run.id, workflow, "%s step %s (%s) raised", run.id, seq, step.name)
        delay, message = None, f"unexpected {type(exc).__name__}: {exc}"
    if delay is None:
        logger.warning(
            "%s step %s (%s) failed permanently: %s",
            run.id, seq, step.name, masked(run.id, workflow, message),
        )  # fmt: skip
    store.step_fail(
        run,
        workflow,
        step,
        seq,
        claim=None,
        seen=seen,
        error=message,
        retry_in_seconds=delay,
    )


def _park_for_version(run: store.StepState, seq: int, seen: store.CheckpointRow | None) -> None:
    try:
        deployed = f"this code has v{registry.latest(run.workflow).version}"
    except Exception:
        deployed = "this code has no such workflow"
    store.run_park(
        run.id,
        seq,
        f"definition changed under a running run: it started on {run.workflow} v{run.version}, "
        f"{deployed}; resuming could replay steps that no longer match their checkpoints",
        kind=RunEvent.Kind.VERSION_MISMATCH,
        fence=seen.fence if seen else None,
    )
