"""One claimed attempt of an effect or llm step: reconcile, call, fenced completion.

The rule for effects (docs/protocol.md, "Unknown outcomes"): once an effect's call may have started,
the step ends only COMPLETED (made, replayed, or found by its reconcile) or parked NEEDS_ATTENTION
with "outcome unknown" — never FAILED — unless its reconcile proves the effect did not happen.
FAILED means "did not happen", so a failed run undoes exactly the effects that are known to have
happened. Which failure ends how is `failures.classify`'s; this module asks it and records the
verdict.
"""

from __future__ import annotations

import logging
import math
import random
import time
import traceback
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connection

from agentflow import _store as store
from agentflow._base.context import StepContext
from agentflow._base.states import StepKind
from agentflow._conf import settings
from agentflow._core import faults, pooler
from agentflow._core.registry import CodeDefined, StepDef, Workflow
from agentflow._core.serialization import NotJSONError, to_json
from agentflow._engine import failures
from agentflow._engine.failures import Cause, Moment
from agentflow._limits import limiter
from agentflow._limits.store import step_wait_turn
from agentflow.exceptions import PartnerWait
from agentflow.models import RunEvent

logger = logging.getLogger("agentflow.attempts")  # the name hosts' LOGGING knows

#: How long a finished effect waits for a lost database before giving its result up (its
#: lease, renewed meanwhile, still holds it; a takeover would reconcile).
COMPLETION_RETRY_SECONDS = (0.5, 1.0, 2.0, 4.0)


def transient(exc: BaseException) -> bool:
    """Try again later under the same key: TRANSIENT, or any database error that is the
    database's or a pooler's (a lost prepared statement, a serialization failure), never the
    step's bug (agentflow._core.pooler)."""
    return isinstance(exc, failures.TRANSIENT) or pooler.database_trouble(exc)


class _Parked(Exception):
    """The attempt's end is recorded already (parked for an operator, or settled for a
    cancel); nothing more to do for this message."""


class ClaimedAttempt:
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
        #: An operator cancelled the run while this effect's outcome was unknown: the attempt
        #: only asks the partner what happened, and never makes the effect
        #: (docs/protocol.md, "Operator actions").
        self.settling = run.cancel_requested and self.is_effect and not step.compensation_only

    @property
    def is_effect(self) -> bool:
        return self.step.kind == StepKind.EFFECT

    def run(self) -> None:
        try:
            output = self._produce()
        except _Parked:
            return
        except Exception as exc:
            self._act(failures.classify(self._facts(exc)))
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
                    "trying again in %.1f s",
                    self.ctx.run_id,
                    self.seq,
                    pause,
                )
                connection.close()
                time.sleep(pause)
                continue
            except DatabaseError as exc:
                if pause is None or not pooler.lost_prepared_statement(exc):
                    raise
                if pooler.mode() != "auto":
                    raise
                # A pooler lost the statement: it never ran. Once more, unprepared.
                pooler.forget_prepared_statements(connection)
                continue
            if not done:
                logger.warning(
                    "%s step %s: fenced out, result discarded", self.ctx.run_id, self.seq
                )
            elif isinstance(self.workflow, CodeDefined):
                self.workflow.call_recorded(self.step, output)
            return

    def _window(self) -> float | None:
        if not self.is_effect:
            return None
        window = self.step.key_window_seconds
        return settings.AGENTFLOW_KEY_WINDOW_SECONDS if window is None else window

    def _produce(self) -> Any:
        """Reconcile an unknown outcome, apply the key-age guard, or run the step."""
        if self.settling:
            return self._adopt(self._reconcile(Moment.SETTLE))
        window = self._window()
        too_old = window is not None and self.claim.key_age_seconds > window
        if self.claim.outcome_unknown or too_old:
            found = self._reconcile(Moment.TAKEOVER, window_seconds=window, too_old=too_old)
            if found is not None:
                return self._adopt(found)
        return to_json(self._call(), f"output of step {self.step.name}")

    def _reconcile(self, moment: Moment, **facts: Any) -> Any:
        """What the step's reconcile found at the partner; None when the attempt goes on
        without it (`failures.Proceed`). Any other verdict is recorded, then raises _Parked."""
        if self.step.reconcile is None:
            verdict = failures.classify(self._facts(None, moment, cause=Cause.UNASKED, **facts))
        else:
            try:
                found = self.step.reconcile(self.ctx)
            except Exception as exc:
                verdict = failures.classify(self._facts(exc, moment, **facts))
            else:
                if found is not None:
                    return found
                verdict = failures.classify(self._facts(None, moment, cause=Cause.ABSENT, **facts))
        if isinstance(verdict, failures.Proceed):
            return None
        self._act(verdict)
        raise _Parked

    def _facts(
        self,
        exc: BaseException | None,
        moment: Moment = Moment.RUN,
        *,
        cause: Cause | None = None,
        **facts: Any,
    ) -> failures.Failure:
        return failure_facts(
            self.step, self.claim.attempt, exc, moment=moment, cause=cause, **facts
        )

    def _call(self) -> Any:
        """The step itself; a model request takes its turn at partner `llm` (or the model's
        name, when that is what AGENTFLOW_PARTNER_LIMITS names), as any partner call does."""
        partner = limiter.model_partner() if self.step.kind == StepKind.LLM else None
        if partner is None:
            return self.step.fn(self.ctx)
        with limiter.partner_call(partner, self.step.name):
            return self.step.fn(self.ctx)

    def _act(self, verdict: failures.Verdict) -> None:
        """Record what the failure means (`failures.classify`)."""
        if verdict.log_traceback:
            log_raised(
                logger,
                self.ctx.run_id,
                self.workflow,
                "%s step %s (%s) raised",
                self.ctx.run_id,
                self.seq,
                self.step.name,
            )
        if isinstance(verdict, failures.Retry):
            self._fail(verdict.error, retry_in_seconds=verdict.delay_seconds)
        elif isinstance(verdict, failures.Fail):
            self._fail(verdict.error, retry_in_seconds=None)
        elif isinstance(verdict, failures.Wait):
            self._wait_turn(verdict)
        elif isinstance(verdict, failures.Park):
            self._park(verdict.reason, kind=verdict.kind, error=verdict.error)
        elif isinstance(verdict, failures.Ask):
            self._ask(verdict)

    def _wait_turn(self, wait: failures.Wait) -> None:
        """No turn at the partner: the step waits for it, giving its attempt back; whatever
        this attempt's earlier calls may have done stays "may have happened". `wait.unknown`:
        the attempt's own call may have happened and only its reconcile can tell: the next
        claim asks it first, as a takeover does."""
        logger.info(
            "%s step %s (%s): %s; waits %.2f s",
            self.ctx.run_id,
            self.seq,
            self.step.name,
            wait.why,
            wait.seconds,
        )
        step_wait_turn(
            self.ctx.run_id,
            self.seq,
            partner=wait.partner,
            why=wait.why,
            seconds=wait.seconds,
            claim=self.claim,
            unknown=wait.unknown,
            spent=limiter.failed_calls() > 0,
        )

    def _ask(self, ask: failures.Ask) -> None:
        """The call may have reached the partner and no answer says what it did: ask it.
        Found, the effect is adopted and recorded as the step's outcome."""
        try:
            found = self._reconcile(Moment.ASK, asked=ask)
        except _Parked:
            return
        try:
            output = self._adopt(found)
        except NotJSONError as exc:
            self._act(failures.classify(self._facts(exc, Moment.ADOPT)))
            return
        self._complete(output)

    def _adopt(self, found: Any) -> Any:
        output = to_json(found, f"reconcile of {self.step.name}")
        logger.info(
            "%s step %d %s: the partner already has it; adopted, not repeated",
            self.ctx.run_id,
            self.seq,
            self.step.name,
        )
        store.event_add(
            self.ctx.run_id,
            RunEvent.Kind.RECONCILED,
            f"{self.step.name}: effect found at the partner; adopted, not repeated",
            seq=self.seq,
            data={"attempt": self.claim.attempt, "fence": self.claim.fence, "output": output},
        )
        return output

    def _fail(self, error: str, *, retry_in_seconds: float | None) -> None:
        if retry_in_seconds is None:
            logger.warning(
                "%s step %s (%s) failed permanently: %s",
                self.ctx.run_id,
                self.seq,
                self.step.name,
                masked(self.ctx.run_id, self.workflow, error),
            )
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


def failure_facts(
    step: StepDef,
    attempt: int,
    exc: BaseException | None = None,
    *,
    moment: Moment = Moment.RUN,
    cause: Cause | None = None,
    max_attempts: int | None = None,
    **facts: Any,
) -> failures.Failure:
    """The plain facts `failures.classify` decides on: `exc` raised at `step`'s attempt (or
    `cause`, when nothing raised)."""
    if cause is None:
        assert exc is not None, "a failure without an error names its cause"
        cause = failures.cause_of(exc)
    wait = exc if isinstance(exc, PartnerWait) else None
    return failures.Failure(
        cause=cause,
        moment=moment,
        step=step.name,
        kind=step.kind,
        detail="" if exc is None else str(exc),
        error_type="" if exc is None else type(exc).__name__,
        attempt=attempt,
        max_attempts=step.retry.max_attempts if max_attempts is None else max_attempts,
        reconcile=step.reconcile is not None,
        spent=limiter.failed_calls() > 0,
        backoff_seconds=0.0 if exc is None else retry_delay(step, attempt, exc),
        partner=wait.partner if wait is not None else "",
        wait_seconds=wait.wait_seconds if wait is not None else 0.0,
        **facts,
    )


def describe(exc: BaseException) -> str:
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


# --- what the engine logs of a run --------------------------------------------------------------
def masked(run_id: str, workflow: Workflow, text: str) -> str:
    """`text` (an error, a traceback) as the engine logs it (`store.masked`)."""
    return store.masked(run_id, text, workflow=workflow)


def log_raised(
    log: logging.Logger, run_id: str, workflow: Workflow, message: str, *args: Any
) -> None:
    """`log.exception(message, *args)`, its traceback masked like `masked`."""
    if not workflow.declares_sensitive():
        log.exception(message, *args)
        return
    log.error(f"{message}\n%s", *args, masked(run_id, workflow, traceback.format_exc()))
