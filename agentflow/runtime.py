"""Replay-or-execute one step of a run (SPEC 3.3): the order of operations is the protocol.

The rule for effects (SPEC 3.3a): once an effect's call may have started, the step ends only
COMPLETED (made, replayed, or found by its reconcile) or parked NEEDS_ATTENTION with "outcome
unknown" — never FAILED — unless its reconcile proves the effect did not happen. FAILED means
"did not happen", so a failed run undoes exactly the effects that are known to have happened.
"""

from __future__ import annotations

import logging
import math
import random
import time
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, connection, transaction

from agentflow import codefirst, dispatch, faults, leases, registry, store, telemetry
from agentflow.codefirst import NEXT_CALL, CodeWorkflow
from agentflow.context import StepContext
from agentflow.exceptions import PermanentStepError, RetryableStepError
from agentflow.models import RunEvent
from agentflow.registry import StepDef, Workflow
from agentflow.serialization import NotJSONError, to_json
from agentflow.states import ACTIVE_RUN_STATUSES, CLAIMED_KINDS, StepKind, StepStatus

logger = logging.getLogger(__name__)

#: How long a finished effect waits for a lost database before giving its result up (its
#: lease, renewed meanwhile, still holds it; a takeover would reconcile).
COMPLETION_RETRY_SECONDS = (0.5, 1.0, 2.0, 4.0)
#: Errors that say "try again later under the same key": the partner's, the database's, and a
#: soft time limit (a slow partner; the hard limit kills the process, which is a crash).
TRANSIENT = (RetryableStepError, OperationalError, InterfaceError, SoftTimeLimitExceeded)


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
        if redelivered or run.overdue:
            dispatch.send_step(run.id, run.current_seq)
        return
    if seq > run.current_seq:
        return
    seen = run.checkpoint
    workflow = registry.lookup(run.workflow, run.version)
    if workflow is None:
        _park_for_version(run, seq, seen)
        return
    in_flight = seen is not None and seen.status == StepStatus.IN_PROGRESS
    if isinstance(workflow, CodeWorkflow) and run.current_step == NEXT_CALL:
        if run.cancel_requested and not in_flight:
            store.cancel_begin(run.id, seq)
            return
        step = _next_call(run, workflow, seq, seen)
        if step is None:
            return  # finished, failed or parked by the replay
    else:
        step = workflow.step_named(run.current_step)
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
    if run.cancel_requested and not step.compensation_only and not in_flight:
        store.cancel_begin(run.id, seq)  # an operator asked: undo instead of going on
        return
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
    view = getattr(registry.lookup(run.workflow, run.version), "outputs_view", None)
    return StepContext(
        run_id=run.id,
        workflow=run.workflow,
        seq=seq,
        step=step.name,
        attempt=attempt,
        input=run.input,
        load_outputs=lambda: (view or _same)(store.outputs_load(run.id, seq)),
        key=step.key,
    )


def _same(outputs: dict[str, Any]) -> dict[str, Any]:
    return outputs


# --- code-first runs: replay the function up to its next call -------------------------------------
def _next_call(
    run: store.StepState, workflow: CodeWorkflow, seq: int, seen: store.CheckpointRow | None
) -> StepDef | None:
    """Replay the run's function against its recorded calls (SPEC §4 B). Returns its next
    call as this task's step, or None when the run was finished, failed or parked instead."""
    try:
        outcome = codefirst.replay(
            workflow,
            run_id=run.id,
            input=run.input,
            seq=seq,
            branch=run.branch,
            recorded=store.calls_load(run.id, seq + 1),
            reusable=lambda: store.superseded_reusable(run.id),
        )
    except Exception as exc:  # a bug in the run's function: fail readably, do not loop
        logger.exception("%s: the function of %s raised", run.id, workflow.name)
        outcome = codefirst.Failed(reason=f"unexpected {type(exc).__name__}: {exc}")
    saved = getattr(outcome, "tokens_saved", 0)
    if saved:
        telemetry.model_tokens(workflow=workflow, saved=saved)
    if isinstance(outcome, codefirst.NextCall):
        logger.info(
            "%s position %d %s: replayed %d calls from checkpoints (%d model turns, %d tokens "
            "not spent again)",
            run.id, seq, outcome.step.name, outcome.replayed, outcome.replayed_turns,
            outcome.tokens_saved,
        )  # fmt: skip
        return outcome.step
    if isinstance(outcome, codefirst.Finished):
        store.run_finish(run.id, seq, outcome.output)
    elif isinstance(outcome, codefirst.Failed):
        store.run_fail_between_calls(run.id, workflow, seq, outcome.reason)
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
    ctx = _context(run, step, seq, claim.attempt)
    faults.crash_point(step.name, "after_claim", claim.attempt)
    attempt = _Attempt(run, workflow, step, seq, claim, ctx)
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


class _Parked(Exception):
    """The run was parked for an operator; nothing more to do for this message."""


class _Attempt:
    """One claimed attempt of an effect or llm step, from reconcile to its recorded end."""

    def __init__(
        self,
        run: store.StepState,
        workflow: Workflow,
        step: StepDef,
        seq: int,
        claim: store.Claim,
        ctx: StepContext,
    ) -> None:
        self.run_state, self.workflow, self.step, self.seq = run, workflow, step, seq
        self.claim, self.ctx = claim, ctx

    @property
    def is_effect(self) -> bool:
        return self.step.kind == StepKind.EFFECT

    def run(self) -> None:
        try:
            output = self._produce()
        except _Parked:
            return
        except NotJSONError as exc:
            # The call returned, so its effect may stand: an operator decides.
            self._park(
                f"{self.step.name} ran but its result cannot be recorded ({exc}); check the "
                "partner before retrying",
                kind=RunEvent.Kind.NEEDS_ATTENTION,
                error=str(exc),
            )
            return
        except Exception as exc:
            self._after_error(exc)
            return
        faults.crash_point(self.step.name, "after_effect", self.claim.attempt)
        self._complete(output)

    def _complete(self, output: Any) -> None:
        """Record the outcome. The effect has happened and only this process knows its result,
        so a lost database connection (a restart, a failover) is waited out for a few seconds
        rather than dropping it: the lease is still renewed meanwhile, and the step's key keeps
        a takeover safe if the database stays away longer."""
        for pause in (*COMPLETION_RETRY_SECONDS, None):
            try:
                done = store.step_complete(
                    self.run_state, self.workflow, self.step, self.seq, self.claim, output
                )
            except (OperationalError, InterfaceError):
                if pause is None or (connection.connection is not None and connection.is_usable()):
                    raise  # out of patience, or a lock timeout rather than a lost server
                logger.warning(
                    "%s step %s: the database went away before the result was recorded; "
                    "trying again in %.1f s", self.ctx.run_id, self.seq, pause,
                )  # fmt: skip
                connection.close()
                time.sleep(pause)
                continue
            if not done:
                logger.warning(
                    "%s step %s: fenced out, result discarded", self.ctx.run_id, self.seq
                )
            elif self.step.kind == StepKind.LLM and isinstance(self.workflow, CodeWorkflow):
                telemetry.model_tokens(workflow=self.workflow, spent=_tokens_of(output))
            return

    def _window(self) -> float | None:
        if not self.is_effect:
            return None
        window = self.step.key_window_seconds
        return settings.AGENTFLOW_KEY_WINDOW_SECONDS if window is None else window

    def _produce(self) -> Any:
        """Reconcile an unknown outcome, apply the key-age guard, or run the step."""
        window = self._window()
        too_old = window is not None and self.claim.key_age_seconds > window
        if self.claim.outcome_unknown or too_old:
            if self.step.reconcile is None:
                if too_old:
                    self._park_unknown(
                        f"its first attempt is older than the partner's idempotency window "
                        f"({window:.0f} s) and there is no way to ask the partner what happened"
                    )
                    raise _Parked
            else:
                try:
                    found = self.step.reconcile(self.ctx)
                except Exception as exc:
                    if too_old:
                        self._park_unknown(
                            f"its first attempt is older than the partner's idempotency window "
                            f"({window:.0f} s) and the partner could not say whether it "
                            f"happened ({_describe(exc)})"
                        )
                        raise _Parked from None
                    found = None  # inside the window the idempotency key protects the retry
                else:
                    if found is not None:
                        return self._adopt(found)
        return to_json(self.step.fn(self.ctx), f"output of step {self.step.name}")

    def _adopt(self, found: Any) -> Any:
        output = to_json(found, f"reconcile of {self.step.name}")
        logger.info(
            "%s step %d %s: the partner already has it; adopted, not repeated",
            self.ctx.run_id, self.seq, self.step.name,
        )  # fmt: skip
        store.event_add(
            self.ctx.run_id,
            RunEvent.Kind.RECONCILED,
            f"{self.step.name}: effect found at the partner; adopted, not repeated",
            seq=self.seq,
            data={"attempt": self.claim.attempt, "fence": self.claim.fence, "output": output},
        )
        return output

    def _after_error(self, exc: Exception) -> None:
        attempt = self.claim.attempt
        if isinstance(exc, PermanentStepError):
            # The partner refused: the effect did not happen, so the run may fail and undo.
            self._fail(str(exc), retry_in_seconds=None)
            return
        if isinstance(exc, TRANSIENT):
            message = _describe(exc)
            if not self.step.retry.exhausted(attempt):
                self._fail(message, retry_in_seconds=retry_delay(self.step, attempt, exc))
                return
            reason = f"gave up after {attempt} attempts: {message}"
        else:
            logger.exception("%s step %s (%s) raised", self.ctx.run_id, self.seq, self.step.name)
            reason = f"unexpected {type(exc).__name__}: {exc}"
        if not self.is_effect:
            self._fail(reason, retry_in_seconds=None)  # a model call changes nothing outside
            return
        self._resolve_unknown(reason)

    def _resolve_unknown(self, reason: str) -> None:
        """The call may have reached the partner and no answer says what it did: ask it."""
        if self.step.reconcile is None:
            self._park_unknown(reason)
            return
        try:
            found = self.step.reconcile(self.ctx)
        except Exception as exc:
            self._park_unknown(f"{reason}; the partner could not say whether it happened "
                               f"({_describe(exc)})")  # fmt: skip
            return
        if found is None:
            self._fail(f"{reason} (the partner confirms it did not happen)", retry_in_seconds=None)
            return
        try:
            output = self._adopt(found)
        except NotJSONError as exc:
            self._park_unknown(f"the partner has it but it cannot be recorded ({exc})")
            return
        self._complete(output)

    def _fail(self, error: str, *, retry_in_seconds: float | None) -> None:
        if retry_in_seconds is None:
            logger.warning(
                "%s step %s (%s) failed permanently: %s",
                self.ctx.run_id, self.seq, self.step.name, error,
            )  # fmt: skip
        store.step_fail(
            self.run_state,
            self.workflow,
            self.step,
            self.seq,
            claim=self.claim,
            seen=None,
            error=error,
            retry_in_seconds=retry_in_seconds,
        )

    def _park_unknown(self, reason: str) -> None:
        self._park(
            f"outcome unknown: {self.step.name} may or may not have taken effect: {reason}. "
            "Retry asks the partner first and never repeats it blindly.",
            kind=RunEvent.Kind.OUTCOME_UNKNOWN,
            error=reason,
        )

    def _park(self, message: str, *, kind: str, error: str) -> None:
        """Park the run, releasing our claim: the checkpoint stays IN_PROGRESS (its effect may
        stand), so an operator's retry takes it over and asks the partner first."""
        store.run_park(
            self.ctx.run_id,
            self.seq,
            message,
            kind=kind,
            fence=self.claim.fence,
            claimed=True,
            data={"attempt": self.claim.attempt, "fence": self.claim.fence, "error": error},
        )


def _tokens_of(output: Any) -> int:
    """A recorded model turn's total tokens (0 for anything else)."""
    usage = output.get("usage") if isinstance(output, dict) else None
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    return total if isinstance(total, int) and total > 0 else 0


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def retry_delay(step: StepDef, attempt: int, exc: BaseException) -> float:
    """The back-off before the next attempt: the policy's, or longer if the partner asked
    (Retry-After), never more than AGENTFLOW_MAX_BACKOFF: a partner cannot park a run for
    years, and `inf` cannot break the arithmetic."""
    ceiling = float(settings.AGENTFLOW_MAX_BACKOFF)
    delay = step.retry.delay_seconds(attempt, rng=random.Random())
    asked = getattr(exc, "retry_after_seconds", None)
    if asked is not None:
        try:
            asked = float(asked)
        except (TypeError, ValueError):
            asked = None
    if asked is not None and not math.isnan(asked):
        delay = max(delay, asked)
    if not math.isfinite(delay):
        return ceiling
    return min(max(delay, 0.0), ceiling)


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
        if not store.unclaimed_complete(locked, workflow, step, seq, seen, output):
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
    if isinstance(exc, PermanentStepError | NotJSONError):
        delay, message = None, str(exc)
    elif isinstance(exc, TRANSIENT):
        message = _describe(exc)
        if step.retry.exhausted(attempt):
            delay, message = None, f"gave up after {attempt} attempts: {message}"
        else:
            delay = retry_delay(step, attempt, exc)
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
