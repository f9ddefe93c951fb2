"""Agent mode's half of a step (docs/agent.md): a run of a code-defined workflow between calls
is replayed up to its next call, which becomes the task's step; or the task runs one member of
a batch. The runtime is handed this module when the app starts (`AgentflowConfig.ready`,
`runtime.CodeRuns`) and imports none of it, so a graph run never enters agent code.

Parallel read-only tool calls: which calls of a model turn run at once, and how a run says
that it is running them. A turn that asks for several tools in a row that only read
(declared `read_only`, needing no approval; or refused, which run nothing) runs them as one
batch: each a step task of its own, all published together, at the consecutive positions the
function would have made them at, joined when every one is recorded (`store.batches`). Their
results enter the conversation in the model's order, since the function reads them back in
that order on the next replay. A side effect ends a batch: effects stay one at a time, in the
model's order.

While a batch runs, the run's `current_seq` is its first position and `batch_last` its last
(`current_step` says so in words, `(calls 5-6 at once)`, for people only); every write of a
member is fenced on both. A member sees the run's history before the batch, not its
siblings' results: they run at once.
"""

from __future__ import annotations

import logging
from datetime import datetime

from agentflow import _store as store
from agentflow._base.states import StepStatus
from agentflow._core import faults, leases, pooler
from agentflow._core.registry import CodeDefined, StepDef
from agentflow._core.serialization import to_json
from agentflow._engine import context_loader, failures
from agentflow._engine.attempts import failure_facts, log_raised, masked
from agentflow._limits import limiter
from agentflow._limits.store import step_wait_turn
from agentflow._observe import telemetry
from agentflow.agent import loop
from agentflow.agent import telemetry as agent_telemetry
from agentflow.agent.loop import CodeWorkflow
from agentflow.agent.mcp_tools import tool_servers
from agentflow.exceptions import PartnerWait, ToolServerUnavailable, partner_wait_reason
from agentflow.models import RunEvent

#: Moved from `agentflow._engine.runtime`: its logger, the name hosts' LOGGING knows.
logger = logging.getLogger("agentflow.runtime")


# --- between calls: replay the function up to its next call ------------------------------------
def next_call(
    run: store.StepState, workflow: CodeDefined, seq: int, seen: store.CheckpointRow | None
) -> StepDef | None:
    """Replay the run's function against its recorded calls (docs/agent.md). Returns its next
    call as this task's step, or None when the run was finished, failed or parked instead."""
    assert isinstance(workflow, CodeWorkflow)  # the one code-defined kind
    outage = _tool_servers_outage(workflow)
    if outage is not None:
        partner, why, seconds = outage
        step_wait_turn(run.id, seq, partner=partner, why=why, seconds=seconds, seen=seen)
        return None
    try:
        outcome = _replay(run, workflow, seq)
    except Exception as exc:  # a bug in the run's function: fail readably, do not loop
        if pooler.database_trouble(exc):
            raise  # the engine's own reads failed, not the function: the message is retried
        log_raised(logger, run.id, workflow, "%s: the function of %s raised", run.id, workflow.name)
        outcome = loop.Failed(reason=f"unexpected {type(exc).__name__}: {exc}")
    saved = getattr(outcome, "tokens_saved", 0)
    if saved:
        agent_telemetry.model_tokens(workflow=workflow, saved=saved)
    cost_saved = getattr(outcome, "cost_saved", None)
    if cost_saved:
        agent_telemetry.model_cost_saved(workflow=workflow, saved=cost_saved)
    if isinstance(outcome, loop.NextCall):
        telemetry.replayed(
            calls=outcome.replayed, turns=outcome.replayed_turns, tokens_saved=outcome.tokens_saved
        )
        logger.info(
            "%s position %d %s: replayed %d calls from checkpoints (%d model turns, %d tokens "
            "not spent again)",
            run.id,
            seq,
            outcome.step.name,
            outcome.replayed,
            outcome.replayed_turns,
            outcome.tokens_saved,
        )
        if len(outcome.batch) > 1:
            # Read-only calls that run at once: the others' tasks are published once the batch
            # is begun, and this task runs the first.
            last = seq + len(outcome.batch) - 1
            if store.batch_begin(run, seq, last):
                begun = store.state_load(run.id, seq)
                if begun is not None:
                    batch_member(
                        begun, workflow, seq, begun.checkpoint, (seq, last), batch=outcome.batch
                    )
            return None
        return agent_telemetry.traced_agent_call(outcome.step)
    if isinstance(outcome, loop.Finished):
        store.run_finish(run.id, seq, outcome.output)
    elif isinstance(outcome, loop.Failed):
        store.run_fail_between_calls(run.id, workflow, seq, outcome.reason)
    elif isinstance(outcome, loop.OverBudget):
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


def _replay(run: store.StepState, workflow: CodeWorkflow, seq: int) -> loop.Outcome:
    """The run's function replayed up to position `seq` against what the run recorded."""
    return loop.replay(
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


# --- one member of a batch: run at once with its siblings ----------------------------------------
def batch_member(
    run: store.StepState,
    workflow: CodeDefined,
    seq: int,
    seen: store.CheckpointRow | None,
    span: tuple[int, int],
    *,
    redelivered: bool = False,
    own: bool = False,
    batch: tuple[StepDef, ...] | None = None,
) -> None:
    """One read-only call of a batch (see the module): found by replaying the
    function up to the batch's first position (or handed over, `batch`, by the task that
    began it and runs the first), run, and recorded; the last member recorded moves the run
    on (`store.batches`). A member is a read: what its failure means is the read rule's
    (`failures.classify`, docs/protocol.md "What a failure means"), recorded by the batch's
    own fenced writes.

    Only the task that began the batch runs its first position without a message of its own,
    so a message for the first position is the sweeper's doorbell for a stalled batch (or a
    redelivery): it publishes again every member not recorded yet, whose message or worker
    may have been lost. A member keeps the batch's wake-up time pushed on while it runs, so
    the doorbell never rings for a read that is only slow (it would run twice, and its second
    run could be the one recorded); and a member's own message (`own`: its countdown after a
    partner wait or a retry, `dispatch.member_hint`) is no doorbell, even at the first
    position, for the same reason."""
    assert isinstance(workflow, CodeWorkflow)  # the one code-defined kind
    first, last = span
    if _rings_doorbell(seq, first, handed=batch is not None, own=own, redelivered=redelivered):
        store.batch_republish(run.id, first, last, but=seq)
    if seen is not None and seen.status == StepStatus.COMPLETED:
        return
    if store.claim_blocker(seen) is not None:
        return  # a retry not yet due (an early duplicate), or a failure for good
    if batch is None:
        if _waits_for_tool_servers(run, workflow, seq, seen):
            return
        batch = _replayed_batch(run, workflow, first)
    if not _matches(batch, span, seq, seen):
        _park_diverged(run, span)
        return
    step = agent_telemetry.traced_agent_call(batch[seq - first])
    attempt = seen.attempts + 1 if seen else 1
    started = store.batch_started()
    logger.info(
        "%s position %d %s: runs at once with positions %d-%d", run.id, seq, step.name, first, last
    )
    ctx = context_loader.step_context(run, step, seq, attempt)
    if run.hold:
        store.batch_member_goes(run, seq)  # if it held the run's reason, it holds it no more
    member = _Member(run, workflow, step, seq, seen, started=started, attempt=attempt)
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
    except Exception as exc:
        member.failed(exc)


def _rings_doorbell(seq: int, first: int, *, handed: bool, own: bool, redelivered: bool) -> bool:
    """This message is the batch's doorbell (see `batch_member`): at its first position, or
    given back by the broker; never the task that began the batch (`handed` it), nor a member's
    own countdown."""
    return not handed and not own and (seq == first or redelivered)


def _waits_for_tool_servers(
    run: store.StepState, workflow: CodeWorkflow, seq: int, seen: store.CheckpointRow | None
) -> bool:
    """The run's tool servers are out (`_tool_servers_outage`): the member waits for them, as
    for any partner's turn."""
    outage = _tool_servers_outage(workflow)
    if outage is None:
        return False
    partner, why, seconds = outage
    store.batch_wait_turn(run, workflow, seq, seen, partner=partner, why=why, seconds=seconds)
    return True


def _replayed_batch(
    run: store.StepState, workflow: CodeWorkflow, first: int
) -> tuple[StepDef, ...]:
    """The batch the function makes at `first`, replayed against the run's recorded calls
    (empty when it now makes no call there)."""
    outcome = _replay(run, workflow, first)
    if not isinstance(outcome, loop.NextCall):
        return ()
    if outcome.tokens_saved:  # this task's replay, counted as every task's is
        agent_telemetry.model_tokens(workflow=workflow, saved=outcome.tokens_saved)
    if outcome.cost_saved:
        agent_telemetry.model_cost_saved(workflow=workflow, saved=outcome.cost_saved)
    return outcome.batch


def _matches(
    batch: tuple[StepDef, ...],
    span: tuple[int, int],
    seq: int,
    seen: store.CheckpointRow | None,
) -> bool:
    """The function still makes the calls the batch was begun with: as many, and the member's
    own by name."""
    first, last = span
    if len(batch) != last - first + 1:
        return False
    return seen is None or seen.name == batch[seq - first].name


def _park_diverged(run: store.StepState, span: tuple[int, int]) -> None:
    first, last = span
    store.run_park(
        run.id,
        first,
        f"the calls at positions {first}-{last} were begun at once, and the function now "
        "makes other calls there; fork or retry once the code matches",
        kind=RunEvent.Kind.DIVERGENCE,
        fence=_fence_at(run.id, first),
    )


def member_verdict(step: StepDef, attempt: int, exc: BaseException) -> failures.Verdict:
    """What a member's failure means: a read step's verdict, decided where every step's is
    (`failures.classify`), from the facts a read step's attempt gives (`failure_facts`)."""
    return failures.classify(failure_facts(step, attempt, exc))


class _Member:
    """One member's attempt, as its failure is recorded: the read rule's verdict
    (`failures.classify`, the facts built as a read step's are), written by the batch's fenced
    writes (`store.batches`) instead of a step's."""

    def __init__(
        self,
        run: store.StepState,
        workflow: CodeWorkflow,
        step: StepDef,
        seq: int,
        seen: store.CheckpointRow | None,
        *,
        started: datetime,
        attempt: int,
    ) -> None:
        self.run, self.workflow, self.step, self.seq, self.seen = run, workflow, step, seq, seen
        self.started, self.attempt = started, attempt

    def failed(self, exc: Exception) -> None:
        """Record what `exc` means; nothing when the run has left the batch (fenced)."""
        verdict = member_verdict(self.step, self.attempt, exc)
        if verdict.log_traceback:
            log_raised(
                logger,
                self.run.id,
                self.workflow,
                "%s step %s (%s) raised",
                self.run.id,
                self.seq,
                self.step.name,
            )
        try:
            self._record(verdict)
        except store.Fenced:
            return

    def _record(self, verdict: failures.Verdict) -> None:
        run, seq, step = self.run, self.seq, self.step
        if isinstance(verdict, failures.Wait):
            # No turn at the partner: nothing of the member ran past its request, no attempt
            # spent; its siblings go on, and it runs again when its turn comes.
            logger.info(
                "%s step %s (%s): %s; waits %.2f s",
                run.id,
                seq,
                step.name,
                verdict.why,
                verdict.seconds,
            )
            store.batch_wait_turn(
                run,
                self.workflow,
                seq,
                self.seen,
                partner=verdict.partner,
                why=verdict.why,
                seconds=verdict.seconds,
            )
        elif isinstance(verdict, failures.Park):
            data = {"attempt": self.attempt, "error": verdict.error}
            store.batch_park(run, seq, verdict.reason, kind=verdict.kind, data=data)
        elif isinstance(verdict, failures.Retry):
            self._fail(verdict.error, retry_in_seconds=verdict.delay_seconds)
        elif isinstance(verdict, failures.Fail):
            logger.warning(
                "%s step %s (%s) failed permanently: %s",
                run.id,
                seq,
                step.name,
                masked(run.id, self.workflow, verdict.error),
            )
            self._fail(verdict.error, retry_in_seconds=None)
        # A read is never asked about, nor goes on as if nothing failed (`Ask`, `Proceed`).

    def _fail(self, error: str, *, retry_in_seconds: float | None) -> None:
        store.batch_fail(
            self.run,
            self.workflow,
            self.step,
            self.seq,
            self.seen,
            error,
            started_at=self.started,
            attempt=self.attempt,
            retry_in_seconds=retry_in_seconds,
        )


def _fence_at(run_id: str, seq: int) -> int | None:
    state = store.state_load(run_id, seq)
    return state.checkpoint.fence if state is not None and state.checkpoint else None
