"""Replay-or-execute one step of a run (docs/protocol.md, "One step, in order"): the order of
operations is the protocol, and `_run_step` reads in it: load, route, claim, run, record.

Read and db steps run here; effect and llm steps are claimed here and carried out by
`agentflow._engine.attempts`. What any failure means is decided in one place,
`agentflow._engine.failures` (docs/protocol.md, "What a failure means").
"""

from __future__ import annotations

import logging
from dataclasses import replace
from enum import StrEnum

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
from agentflow._core.registry import StepDef, Workflow
from agentflow._core.serialization import NotJSONError, to_json
from agentflow._engine import context_loader, failures
from agentflow._engine.attempts import (
    ClaimedAttempt,
    describe,
    failure_facts,
    log_raised,
    masked,
    retry_delay,
    transient,
)
from agentflow._engine.failures import Cause
from agentflow._limits import limiter
from agentflow._observe import telemetry
from agentflow._privacy import scope as privacy
from agentflow._waits import waits
from agentflow.agent import loop as agent_loop
from agentflow.agent.batches import batch_span
from agentflow.agent.loop import NEXT_CALL, CodeWorkflow
from agentflow.agent.mcp_tools import tool_servers
from agentflow.conf import settings
from agentflow.exceptions import (
    PartnerWait,
    PermanentStepError,
    ToolServerUnavailable,
    partner_wait_reason,
)
from agentflow.models import RunEvent

logger = logging.getLogger("agentflow.runtime")  # the name hosts' LOGGING knows
CONCURRENCY_HOLD = HOLD + ":"


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
    span = batch_span(run.current_step)
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
    if span is not None and isinstance(workflow, CodeWorkflow):
        own = fresh is not None and len(fresh) == 3 and fresh[2] == run.current_step
        _run_batch_member(run, workflow, seq, seen, span, redelivered=redelivered, own=own)
        return
    in_flight = seen is not None and seen.status == StepStatus.IN_PROGRESS
    if isinstance(workflow, CodeWorkflow) and run.current_step == NEXT_CALL:
        if run.cancel_requested and not in_flight and not _settles_first(None, seen):
            store.cancel_begin(run.id, seq)
            return
        step = _next_call(run, workflow, seq, seen)
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
            and not isinstance(workflow, CodeWorkflow)
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
            log_raised(logger, run.id, workflow, "%s step %s (%s): deciding its wait raised",
                       run.id, seq, step.name)  # fmt: skip
        _record_unclaimed(run, workflow, unrun, seq, seen, verdict)
        return None


# --- agent runs: replay the function up to its next call -------------------------------------
def _next_call(
    run: store.StepState, workflow: CodeWorkflow, seq: int, seen: store.CheckpointRow | None
) -> StepDef | None:
    """Replay the run's function against its recorded calls (docs/agent.md). Returns its next
    call as this task's step, or None when the run was finished, failed or parked instead."""
    outage = _tool_servers_outage(workflow)
    if outage is not None:
        partner, why, seconds = outage
        store.step_wait_turn(run.id, seq, partner=partner, why=why, seconds=seconds, seen=seen)
        return None
    try:
        outcome = agent_loop.replay(
            workflow,
            run_id=run.id,
            input=run.input,
            seq=seq,
            branch=run.branch,
            recorded=store.replay_load(run.id, seq + 1),
            reusable=lambda: store.superseded_reusable(run.id, workflow),
            calls=lambda: store.calls_load(run.id, seq + 1),
            attempts=lambda: store.model_attempts(run.id, seq + 1),
            first_turns=lambda: store.model_first_turns(workflow.name, but=run.id),
        )
    except Exception as exc:  # a bug in the run's function: fail readably, do not loop
        if pooler.database_trouble(exc):
            raise  # the engine's own reads failed, not the function: the message is retried
        log_raised(logger, run.id, workflow, "%s: the function of %s raised", run.id, workflow.name)
        outcome = agent_loop.Failed(reason=f"unexpected {type(exc).__name__}: {exc}")
    saved = getattr(outcome, "tokens_saved", 0)
    if saved:
        telemetry.model_tokens(workflow=workflow, saved=saved)
    cost_saved = getattr(outcome, "cost_saved", None)
    if cost_saved:
        telemetry.model_cost_saved(workflow=workflow, saved=cost_saved)
    if isinstance(outcome, agent_loop.NextCall):
        telemetry.replayed(
            calls=outcome.replayed, turns=outcome.replayed_turns, tokens_saved=outcome.tokens_saved
        )
        logger.info(
            "%s position %d %s: replayed %d calls from checkpoints (%d model turns, %d tokens "
            "not spent again)",
            run.id, seq, outcome.step.name, outcome.replayed, outcome.replayed_turns,
            outcome.tokens_saved,
        )  # fmt: skip
        if len(outcome.batch) > 1:
            # Read-only calls that run at once: the others' tasks are published once the batch
            # is begun, and this task runs the first.
            last = seq + len(outcome.batch) - 1
            if store.batch_begin(run, seq, last):
                begun = store.state_load(run.id, seq)
                if begun is not None:
                    _run_batch_member(
                        begun, workflow, seq, begun.checkpoint, (seq, last), batch=outcome.batch
                    )
            return None
        return telemetry.traced_agent_call(outcome.step)
    if isinstance(outcome, agent_loop.Finished):
        store.run_finish(run.id, seq, outcome.output)
    elif isinstance(outcome, agent_loop.Failed):
        store.run_fail_between_calls(run.id, workflow, seq, outcome.reason)
    elif isinstance(outcome, agent_loop.OverBudget):
        if seen is not None and seen.status == StepStatus.IN_PROGRESS and not seen.claimable:
            return None  # a duplicate message: the request in flight was checked when claimed
        store.run_park(
            run.id,
            seq,
            outcome.reason,
            kind=RunEvent.Kind.NEEDS_ATTENTION,
            fence=seen.fence if seen else None,
            data={"budget": outcome.figures},
        )
    else:
        divergence = outcome.divergence
        store.run_park(
            run.id,
            seq,
            f"diverged from its recorded history: {divergence.text()}",
            kind=RunEvent.Kind.DIVERGENCE,
            fence=seen.fence if seen else None,
            data=divergence.as_json(),
        )
    return None


def _tool_servers_outage(workflow: CodeWorkflow) -> tuple[str, str, float] | None:
    """List the MCP servers the run's tools come from, once per process, each as a call to its
    partner key (`mcp:<name>`) through the limiter, before the replay shows the model their
    tools. A server that cannot be listed (not started yet, crashed), or one the limiter gives
    no turn (its breaker open), is an outage the run waits out, as any partner's: the partner,
    why, and how long until it is asked again; None when every server is listed."""
    for server in tool_servers(workflow.toolbox):
        if server.is_listed:
            continue
        try:
            with limiter.partner_call(server.partner, "list_tools"):
                server.ensure_listed()
        except PartnerWait as wait:
            return wait.partner, str(wait), wait.wait_seconds
        except ToolServerUnavailable as exc:
            seconds = exc.retry_after_seconds or 0.0
            logger.warning("%s: %s; asked again in %.0f s", exc.partner, exc, seconds)
            return exc.partner, partner_wait_reason(exc.partner, str(exc)), seconds
    return None


def _run_batch_member(
    run: store.StepState,
    workflow: CodeWorkflow,
    seq: int,
    seen: store.CheckpointRow | None,
    span: tuple[int, int],
    *,
    redelivered: bool = False,
    own: bool = False,
    batch: tuple[StepDef, ...] | None = None,
) -> None:
    """One read-only call of a batch (`agentflow.agent.batches`): found by replaying the
    function up to the batch's first position (or handed over, `batch`, by the task that
    began it and runs the first), run, and recorded; the last member recorded moves the run
    on (`store.batches`).

    Only the task that began the batch runs its first position without a message of its own,
    so a message for the first position is the sweeper's doorbell for a stalled batch (or a
    redelivery): it publishes again every member not recorded yet, whose message or worker
    may have been lost. A member keeps the batch's wake-up time pushed on while it runs, so
    the doorbell never rings for a read that is only slow (it would run twice, and its second
    run could be the one recorded); and a member's own message (`own`: its countdown after a
    partner wait or a retry, `dispatch.member_hint`) is no doorbell, even at the first
    position, for the same reason."""
    first, last = span
    if batch is None and not own and (seq == first or redelivered):
        store.batch_republish(run.id, first, last, but=seq)
    if seen is not None and seen.status == StepStatus.COMPLETED:
        return
    if store.claim_blocker(seen) is not None:
        return  # a retry not yet due (an early duplicate), or a failure for good
    if batch is None:
        outage = _tool_servers_outage(workflow)
        if outage is not None:
            partner, why, seconds = outage
            store.batch_wait_turn(
                run, workflow, seq, seen, partner=partner, why=why, seconds=seconds
            )
            return
        outcome = agent_loop.replay(
            workflow,
            run_id=run.id,
            input=run.input,
            seq=first,
            branch=run.branch,
            recorded=store.replay_load(run.id, first + 1),
            reusable=lambda: store.superseded_reusable(run.id, workflow),
            calls=lambda: store.calls_load(run.id, first + 1),
            attempts=lambda: store.model_attempts(run.id, first + 1),
            first_turns=lambda: store.model_first_turns(workflow.name, but=run.id),
        )
        batch = ()
        if isinstance(outcome, agent_loop.NextCall):
            batch = outcome.batch
            if outcome.tokens_saved:  # this task's replay, counted as every task's is
                telemetry.model_tokens(workflow=workflow, saved=outcome.tokens_saved)
            if outcome.cost_saved:
                telemetry.model_cost_saved(workflow=workflow, saved=outcome.cost_saved)
    if len(batch) != last - first + 1 or (
        seen is not None and seen.name != batch[seq - first].name
    ):
        store.run_park(
            run.id,
            first,
            f"the calls at positions {first}-{last} were begun at once, and the function now "
            "makes other calls there; fork or retry once the code matches",
            kind=RunEvent.Kind.DIVERGENCE,
            fence=_fence_at(run.id, first),
        )
        return
    step = telemetry.traced_agent_call(batch[seq - first])
    attempt = seen.attempts + 1 if seen else 1
    started = store.batch_started()
    logger.info("%s position %d %s: runs at once with positions %d-%d", run.id, seq, step.name,
                first, last)  # fmt: skip
    ctx = context_loader.step_context(run, step, seq, attempt)
    if run.hold:
        store.batch_member_goes(run, seq)  # if it held the run's reason, it holds it no more
    try:
        with leases.kept_alive(
            renew=lambda conn: store.batch_keep_alive(run.id, first, last, conn=conn),
            on_lost=lambda: None,  # the run left the batch: the record is fenced out anyway
        ):
            output = to_json(step.fn(ctx), f"output of step {step.name}")
        faults.crash_point(step.name, "after_effect", attempt)
        store.batch_record(
            run, workflow, step, seq, seen, output, started_at=started, attempt=attempt
        )
    except store.Fenced:
        return
    except PartnerWait as wait:
        if not limiter.failed_calls():
            # No turn at the partner: nothing of the member ran past its request, no attempt
            # spent; its siblings go on, and it runs again when its turn comes.
            logger.info("%s step %s (%s): %s; waits %.2f s", run.id, seq, step.name, wait,
                        wait.wait_seconds)  # fmt: skip
            store.batch_wait_turn(
                run, workflow, seq, seen, partner=wait.partner, why=str(wait),
                seconds=wait.wait_seconds,
            )  # fmt: skip
            return
        # A call of this attempt went and failed before the wait: the attempt was spent.
        exhausted = step.retry.exhausted(attempt)
        message = f"gave up after {attempt} attempts: {wait}" if exhausted else str(wait)
        try:
            store.batch_fail(
                run, workflow, step, seq, seen, message, started_at=started, attempt=attempt,
                retry_in_seconds=None if exhausted else wait.wait_seconds,
            )  # fmt: skip
        except store.Fenced:
            return
    except Exception as exc:
        if pooler.database_trouble(exc):
            raise  # the engine's own statement failed: the message is retried
        delay: float | None = None
        if isinstance(exc, PermanentStepError | NotJSONError):
            message = str(exc)
        elif transient(exc) and not step.retry.exhausted(attempt):
            message, delay = describe(exc), retry_delay(step, attempt, exc)
        else:
            logger.exception("%s step %s (%s) raised", run.id, seq, step.name)
            message = (
                f"unexpected {type(exc).__name__}: {exc}"
                if not transient(exc)
                else (f"gave up after {attempt} attempts: {describe(exc)}")
            )
        try:
            store.batch_fail(
                run, workflow, step, seq, seen, message, started_at=started, attempt=attempt,
                retry_in_seconds=delay,
            )  # fmt: skip
        except store.Fenced:
            return


def _fence_at(run_id: str, seq: int) -> int | None:
    state = store.state_load(run_id, seq)
    return state.checkpoint.fence if state is not None and state.checkpoint else None


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
        store.step_wait_turn(
            run.id, seq, partner=verdict.partner, why=verdict.why, seconds=verdict.seconds,
            seen=seen,
        )  # fmt: skip
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
            run.id, seq, step.name, masked(run.id, workflow, message),
        )  # fmt: skip
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
