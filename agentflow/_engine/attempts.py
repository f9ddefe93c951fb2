"""One claimed attempt of an effect or llm step: reconcile, call, fenced completion.

The rule for effects (docs/protocol.md, "Unknown outcomes"): once an effect's call may have started,
the step ends only COMPLETED (made, replayed, or found by its reconcile) or parked NEEDS_ATTENTION
with "outcome unknown" — never FAILED — unless its reconcile proves the effect did not happen.
FAILED means "did not happen", so a failed run undoes exactly the effects that are known to have
happened.
"""

from __future__ import annotations

import logging
import math
import random
import time
import traceback
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.db import DatabaseError, InterfaceError, OperationalError, connection

from agentflow import _store as store
from agentflow._base.context import StepContext
from agentflow._base.states import StepKind
from agentflow._core import faults, pooler
from agentflow._core.registry import CodeDefined, StepDef, Workflow
from agentflow._core.serialization import NotJSONError, to_json
from agentflow._limits import limiter
from agentflow.conf import settings
from agentflow.exceptions import (
    AnswerLost,
    NeedsAttention,
    OutcomeUnknown,
    PartnerWait,
    PermanentStepError,
    RepeatUnsafe,
    RetryableStepError,
)
from agentflow.models import RunEvent

logger = logging.getLogger("agentflow.attempts")  # the name hosts' LOGGING knows

#: How long a finished effect waits for a lost database before giving its result up (its
#: lease, renewed meanwhile, still holds it; a takeover would reconcile).
COMPLETION_RETRY_SECONDS = (0.5, 1.0, 2.0, 4.0)
#: Errors that say "try again later under the same key": the partner's, the database's, and a
#: soft time limit (a slow partner; the hard limit kills the process, which is a crash).
TRANSIENT = (RetryableStepError, OperationalError, InterfaceError, SoftTimeLimitExceeded)


def transient(exc: BaseException) -> bool:
    """Try again later under the same key: TRANSIENT, or any database error that is the
    database's or a pooler's (a lost prepared statement, a serialization failure), never the
    step's bug (agentflow._core.pooler)."""
    return isinstance(exc, TRANSIENT) or pooler.database_trouble(exc)


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
        except PartnerWait as wait:
            if self._spent_at_bound(wait):
                return
            self._wait_turn(wait)
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
            return self._settle()
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
                except PartnerWait:
                    raise  # its turn at the partner comes later: ask then
                except RepeatUnsafe as exc:
                    self._park_unknown(describe(exc))  # no key makes a repeat safe
                    raise _Parked from None
                except Exception as exc:
                    if too_old:
                        self._park_unknown(
                            f"its first attempt is older than the partner's idempotency window "
                            f"({window:.0f} s) and the partner could not say whether it "
                            f"happened ({describe(exc)})"
                        )
                        raise _Parked from None
                    found = None  # inside the window the idempotency key protects the retry
                else:
                    if found is not None:
                        return self._adopt(found)
        return to_json(self._call(), f"output of step {self.step.name}")

    def _call(self) -> Any:
        """The step itself; a model request takes its turn at partner `llm` (or the model's
        name, when that is what AGENTFLOW_PARTNER_LIMITS names), as any partner call does."""
        partner = limiter.model_partner() if self.step.kind == StepKind.LLM else None
        if partner is None:
            return self.step.fn(self.ctx)
        with limiter.partner_call(partner, self.step.name):
            return self.step.fn(self.ctx)

    def _wait_turn(self, wait: PartnerWait, *, unknown: bool = False) -> None:
        """No turn at the partner: the step waits for it, giving its attempt back; whatever
        this attempt's earlier calls may have done stays "may have happened". `unknown`: the
        attempt's own call may have happened and only its reconcile can tell: the next claim
        asks it first, as a takeover does."""
        logger.info(
            "%s step %s (%s): %s; waits %.2f s",
            self.ctx.run_id, self.seq, self.step.name, wait, wait.wait_seconds,
        )  # fmt: skip
        store.step_wait_turn(
            self.ctx.run_id,
            self.seq,
            partner=wait.partner,
            why=str(wait),
            seconds=wait.wait_seconds,
            claim=self.claim,
            unknown=unknown,
            spent=limiter.failed_calls() > 0,
        )

    def _spent_at_bound(self, wait: PartnerWait) -> bool:
        """A wait after a call of this attempt went and failed (a reconcile Stripe refused, a
        request that was not answered) is no free wait: the attempt was spent. At the bound the
        step ends as an exhausted attempt does (an effect parks "outcome unknown", never FAILED)
        instead of waiting for ever for a partner that keeps failing. True when it ended."""
        attempt = self.claim.attempt
        if not limiter.failed_calls() or not self.step.retry.exhausted(attempt):
            return False
        reason = f"gave up after {attempt} attempts: {wait}"
        if self.is_effect:
            self._park_unknown(reason)
        else:
            self._fail(reason, retry_in_seconds=None)
        return True

    def _settle(self) -> Any:
        """The run is cancelled and this effect may have happened: found at the partner, it is
        adopted (and then undone by the cancel); proven absent, the step fails and the cancel
        has nothing of it to undo; when the partner cannot tell, it is asked again after a
        back-off, then the run parks "outcome unknown"."""
        if self.step.reconcile is None:
            self._park_unknown("the run was cancelled and there is no way to ask the partner")
            raise _Parked
        try:
            found = self.step.reconcile(self.ctx)
        except PartnerWait:
            raise
        except Exception as exc:
            attempt = self.claim.attempt
            retry = transient(exc) or isinstance(exc, OutcomeUnknown)
            if retry and not self.step.retry.exhausted(attempt):
                self._fail(
                    f"cancelled; asking whether it took effect: {describe(exc)}",
                    retry_in_seconds=retry_delay(self.step, attempt, exc),
                )
            else:
                self._park_unknown(
                    f"the run was cancelled and the partner could not say whether it "
                    f"happened ({describe(exc)})"
                )
            raise _Parked from None
        if found is None:
            self._fail(
                "cancelled before it took effect (the partner confirms it did not happen)",
                retry_in_seconds=None,
            )
            raise _Parked
        return self._adopt(found)

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
        if isinstance(exc, NeedsAttention):
            self._park(f"{self.step.name}: {exc}", kind=RunEvent.Kind.NEEDS_ATTENTION,
                       error=str(exc))  # fmt: skip
            return
        if isinstance(exc, PermanentStepError):
            # The partner refused: the effect did not happen, so the run may fail and undo.
            self._fail(str(exc), retry_in_seconds=None)
            return
        if transient(exc):
            message = describe(exc)
            if isinstance(exc, AnswerLost) and self.is_effect and self.step.reconcile is not None:
                # The call went and its answer was lost: it may have happened, so the retry
                # asks first, as a takeover does (docs/protocol.md, "Unknown outcomes"); never calls
                # again blindly.
                self._resolve_unknown(message, retry=exc)
                return
            if not self.step.retry.exhausted(attempt):
                self._fail(message, retry_in_seconds=retry_delay(self.step, attempt, exc))
                return
            reason = f"gave up after {attempt} attempts: {message}"
            if pooler.database_trouble(exc):
                # The database kept failing the engine's own statements: never the step's
                # failure, and a reconcile that finds nothing must not fail the run either.
                self._park_database(reason)
                return
        else:
            log_raised(logger, self.ctx.run_id, self.workflow, "%s step %s (%s) raised",
                       self.ctx.run_id, self.seq, self.step.name)  # fmt: skip
            reason = f"unexpected {type(exc).__name__}: {exc}"
        if not self.is_effect:
            self._fail(reason, retry_in_seconds=None)  # a model call changes nothing outside
            return
        self._resolve_unknown(reason)

    def _resolve_unknown(self, reason: str, *, retry: Exception | None = None) -> None:
        """The call may have reached the partner and no answer says what it did: ask it.

        `retry`: the error of a lost answer with attempts left to try: proven absent, the
        step is tried again after its back-off (the next call is no repeat)."""
        if self.step.reconcile is None:
            self._park_unknown(reason)
            return
        try:
            found = self.step.reconcile(self.ctx)
        except RepeatUnsafe as exc:
            self._park_unknown(f"{reason}; {describe(exc)}")  # nothing can ask, nothing keys it
            return
        except PartnerWait as wait:
            if limiter.failed_calls() and self.step.retry.exhausted(self.claim.attempt):
                # The attempts are spent on a partner that keeps failing: ask no more.
                self._park_unknown(f"{reason}; the partner could not say whether it "
                                   f"happened ({wait})")  # fmt: skip
                return
            self._wait_turn(wait, unknown=True)  # it asks once its turn comes
            return
        except Exception as exc:
            self._park_unknown(f"{reason}; the partner could not say whether it happened "
                               f"({describe(exc)})")  # fmt: skip
            return
        if found is None:
            attempt = self.claim.attempt
            if retry is not None and not self.step.retry.exhausted(attempt):
                self._fail(
                    f"{reason} (the partner confirms it did not happen)",
                    retry_in_seconds=retry_delay(self.step, attempt, retry),
                )
                return
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
                self.ctx.run_id, self.seq, self.step.name,
                masked(self.ctx.run_id, self.workflow, error),
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

    def _park_database(self, reason: str) -> None:
        if self.is_effect:
            self._park_unknown(f"the database kept failing ({reason})")
        else:
            self._park(
                f"{self.step.name}: the database kept failing ({reason}); retry once it is back",
                kind=RunEvent.Kind.NEEDS_ATTENTION,
                error=reason,
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
