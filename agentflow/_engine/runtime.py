"""Replay-or-execute one step of a run (docs/protocol.md, "One step, in order"): the order of
operations is the protocol, and `_run_step` reads in it: load, route, claim, run, record.

Read and db steps run here; effect and llm steps are claimed here and carried out by
`agentflow._engine.attempts`. What any failure means is decided in one place,
`agentflow._engine.failures` (docs/protocol.md, "What a failure means").
A code-defined (agent) run between calls or in a batch is handed to agent mode's step path
(`CodeRuns`); its next call then runs here as any step does.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from enum import StrEnum
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
from agentflow._conf import settings
from agentflow._core import builds, dispatch, faults, leases, pooler, registry
from agentflow._core.registry import NEXT_CALL, CodeDefined, StepDef, Workflow
from agentflow._core.serialization import to_json
from agentflow._engine import context_loader, failures
from agentflow._engine.attempts import (
    ClaimedAttempt,
    failure_facts,
    log_raised,
    masked,
)
from agentflow._engine.failures import Cause
from agentflow._limits import limiter
from agentflow._limits.store import step_wait_turn
from agentflow._observe import telemetry
from agentflow._privacy import scope as privacy
from agentflow._waits import waits
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
    """One step message in the protocol's order (docs/protocol.md, "One step, in order"): load,
    route, claim, run, record; the record's commit publishes what comes next."""
    # Load: the run and its checkpoint at `seq` (a fresh effect step's claim with them).
    _drop_broken_connection()
    run, claim = _load(run_id, seq, fresh)
    if run is None:
        telemetry.unknown_run(run_id)  # deleted here, or another deployment's message
        return
    span = run.batch
    arrival = _arrival(run, seq, span, redelivered=redelivered)
    if arrival is Arrival.REPUBLISH:
        _republish_current(run)
    if arrival is not Arrival.DUE:
        return
    # Route: to its build's code and its definition.
    routed = _route(run, seq)
    if routed is None:
        return  # forwarded to its build's queue, held, or parked: nothing of it runs here
    run, workflow = routed
    seen = run.checkpoint
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
    step = _keyed(run, seq, step)
    mismatch = _mismatch(run, seq, step, seen)
    if mismatch is not None:
        _park_mismatch(run, seq, seen, mismatch)
        return
    assert step is not None  # `_mismatch` says when it is not
    if _cancels_now(run, step, seen):
        store.cancel_begin(run.id, seq)
        return
    if step.waits_for is not None:
        step = _settle_wait(run, workflow, step, seq, seen)
        if step is None:
            return  # WAITING for its timer, signal or approval; or the run moved on
    # Claim, run, record: an effect or llm step claims first and may have acted after; a read
    # or db step records in one commit (docs/protocol.md, "One step, in order").
    if step.kind in CLAIMED_KINDS:
        _run_claimed(run, workflow, step, seq, seen, claim)
    else:
        _run_unclaimed(run, workflow, step, seq, seen, redelivered=redelivered)


class Arrival(StrEnum):
    """What a step message finds its run doing (`_arrival`)."""

    DUE = "due"  # the run is at this step: it runs
    ENDED = "ended"  # terminal, cancelled or parked: nothing to do
    DONE = "done"  # the run is past it: a duplicate
    REPUBLISH = "republish"  # past it, and its successor's message may be lost
    HELD = "held"  # not admitted by its concurrency key: a stray message (store.concurrency)
    EARLY = "early"  # a step the run has not reached


def _arrival(
    run: store.StepState, seq: int, span: tuple[int, int] | None, *, redelivered: bool
) -> Arrival:
    """Does this message run its step? A crash right after the completion commit loses the
    successor's message: republish it for that crash's redelivery, or when the run is overdue.
    A plain duplicate must not, or it rides along to the run's end, one extra message per
    step. A batch of calls at once runs every position of its span."""
    if run.status not in ACTIVE_RUN_STATUSES:
        return Arrival.ENDED
    if seq < run.current_seq:
        return Arrival.REPUBLISH if redelivered or run.overdue else Arrival.DONE
    if run.status == RunStatus.WAITING and run.hold.startswith(CONCURRENCY_HOLD):
        return Arrival.HELD
    if seq == run.current_seq or (span is not None and span[0] <= seq <= span[1]):
        return Arrival.DUE
    return Arrival.EARLY


def _route(run: store.StepState, seq: int) -> tuple[store.StepState, Workflow] | None:
    """Which build's code runs this step (docs/deploys.md, "Builds"), free when it is this
    one's; and the definition it runs under, here. The run as it goes on, or None when nothing
    of it runs here (forwarded, held, or parked: a definition this code does not have)."""
    admitted = routing.admit(run, seq)
    if admitted is None:
        return None
    workflow = registry.lookup(admitted.workflow, admitted.version)
    if workflow is None:
        _park_for_version(admitted, seq, admitted.checkpoint)
        return None
    privacy.enter_run(admitted.id, workflow.personal)
    return admitted, workflow


def _keyed(run: store.StepState, seq: int, step: StepDef | None) -> StepDef | None:
    """A compensation in a forked branch: its key names the branch (docs/protocol.md, "The
    idempotency key")."""
    if step is None or step.key is not None or not run.branch:
        return step
    return replace(step, key=idempotency_key(run.id, seq, run.branch))


def _republish_current(run: store.StepState) -> None:
    queue = builds.route(run.build, run.pinned)
    if queue is None:
        dispatch.send_step(run.id, run.current_seq, priority=run.priority)
    else:
        dispatch.send_step(run.id, run.current_seq, queue=queue, priority=run.priority)


def _mismatch(
    run: store.StepState, seq: int, step: StepDef | None, seen: store.CheckpointRow | None
) -> str | None:
    """Why the definition in this code cannot run the run's step (it parks), or None."""
    if step is None:
        return f"step {run.current_step!r} is not in {run.workflow} v{run.version}"
    if seen is not None and seen.name != step.name:
        return (
            f"non-deterministic definition: step {seq} was recorded as {seen.name!r} "
            f"but the definition now says {step.name!r}"
        )
    return None


def _park_mismatch(
    run: store.StepState, seq: int, seen: store.CheckpointRow | None, reason: str
) -> None:
    store.run_park(
        run.id, seq, reason, kind=RunEvent.Kind.VERSION_MISMATCH, fence=seen.fence if seen else None
    )


def _cancels_now(run: store.StepState, step: StepDef, seen: store.CheckpointRow | None) -> bool:
    """An operator asked: undo instead of going on. But if whether this effect happened is not
    known, its claimed attempt first asks the partner (never making it), and the cancel then
    undoes what it found."""
    in_flight = seen is not None and seen.status == StepStatus.IN_PROGRESS
    if not run.cancel_requested or step.compensation_only or in_flight:
        return False
    return not _settles_first(step.kind, seen)


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
        unsettled = seen is not None and outcomes.unsettled(
            kind=seen.kind, status=seen.status, retryable=seen.retryable
        )
        unrun = replace(step, kind=StepKind.READ, waits_for=None)  # nothing of the step ran
        facts = failure_facts(unrun, 1, exc, cause=Cause.WAIT_RULE, unsettled=unsettled)
        verdict = failures.classify(facts)
        if verdict.log_traceback:
            log_raised(
                logger,
                run.id,
                workflow,
                "%s step %s (%s): deciding its wait raised",
                run.id,
                seq,
                step.name,
            )
        _record_unclaimed(run, workflow, unrun, seq, seen, verdict)
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
            run.id,
            seq,
            step.name,
            claim.attempt,
        )
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
    if seen is not None and seen.status == StepStatus.IN_PROGRESS and seen.claimable:
        # Its owner is gone: the worker died, maybe again and again (`failures`, a lost worker).
        verdict = failures.classify(_lost_worker(step, seen))
        if isinstance(verdict, failures.Park):
            store.run_park(
                run.id,
                seq,
                verdict.reason,
                kind=verdict.kind,
                fence=seen.fence,
                data={"attempt": seen.attempts, "fence": seen.fence, "error": verdict.error},
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
    *,
    redelivered: bool,
) -> None:
    """read: run, then one commit. db: run and commit together, under the run's row lock."""
    if redelivered:
        # Its worker died mid-step: count that attempt, and stop once the bound is reached.
        seen = store.attempt_lost(run.id, step, seq)
        if seen is None or seen.status == StepStatus.COMPLETED:
            return
        verdict = failures.classify(_lost_worker(step, seen))
        if not isinstance(verdict, failures.Proceed):
            _record_unclaimed(run, workflow, step, seq, seen, verdict)
            return
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
    except Exception as exc:
        verdict = failures.classify(failure_facts(step, attempt, exc))
        if verdict.log_traceback:
            log_raised(logger, run.id, workflow, "%s step %s (%s) raised", run.id, seq, step.name)
        _record_unclaimed(run, workflow, step, seq, seen, verdict)


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


def _record_unclaimed(
    run: store.StepState,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    seen: store.CheckpointRow | None,
    verdict: failures.Verdict,
) -> None:
    """Record what a read or db step's failure means (`failures.classify`); nothing of such a
    step stands outside, so it never asks the partner."""
    if isinstance(verdict, failures.Wait):
        # No turn at the partner: nothing of the step ran past its request; no attempt spent.
        step_wait_turn(
            run.id,
            seq,
            partner=verdict.partner,
            why=verdict.why,
            seconds=verdict.seconds,
            seen=seen,
        )
        return
    if isinstance(verdict, failures.Park):
        store.run_park(
            run.id, seq, verdict.reason, kind=verdict.kind, fence=seen.fence if seen else None
        )
        return
    if isinstance(verdict, failures.Fail):
        delay, message = None, verdict.error
        logger.warning(
            "%s step %s (%s) failed permanently: %s",
            run.id,
            seq,
            step.name,
            masked(run.id, workflow, message),
        )
    elif isinstance(verdict, failures.Retry):
        delay, message = verdict.delay_seconds, verdict.error
    else:
        return
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


def _lost_worker(step: StepDef, seen: store.CheckpointRow) -> failures.Failure:
    """The facts of a step whose worker died during its attempt, `seen.attempts` times so far."""
    return failure_facts(
        step,
        seen.attempts,
        cause=Cause.WORKER_LOST,
        max_attempts=settings.AGENTFLOW_MAX_ATTEMPTS,
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
