"""What a step's failure means (docs/protocol.md, "What a failure means"): the one place that
turns what went wrong into what happens next, so the read, db, effect and llm paths (and agent
mode's batch members, which are reads) cannot disagree. Pure: plain facts in, a verdict out;
the caller records it.

The verdicts: `Retry` after a back-off under the same key; `Wait` for a partner's turn, no
attempt spent; `Ask` the partner first, because the effect may have happened; `Park` for a
person; `Fail` for good; `Proceed` as if nothing failed (the key protects a repeat). A run that
fails for good compensates the effects it made first: which ones is in the run's rows, so the
store plans it (`store.step_fail`), and a compensation that fails parks there.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from celery.exceptions import SoftTimeLimitExceeded
from django.db import InterfaceError, OperationalError

from agentflow._base.states import CLAIMED_KINDS, StepKind
from agentflow._core import pooler
from agentflow._core.serialization import NotJSONError
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

#: Errors that say "try again later under the same key": the partner's, the database's, and a
#: soft time limit (a slow partner; the hard limit kills the process, which is a crash).
TRANSIENT = (RetryableStepError, OperationalError, InterfaceError, SoftTimeLimitExceeded)


class Moment(StrEnum):
    """When it went wrong."""

    #: The step's attempt (or what comes before it: its wait's rule, its worker's death).
    RUN = "run"
    #: Its reconcile, before an attempt whose outcome is unknown, or whose key may have expired
    #: at the partner, runs again (docs/protocol.md, "The key window").
    TAKEOVER = "takeover"
    #: Its reconcile, after this attempt's call may have happened.
    ASK = "ask"
    #: Recording what that reconcile found.
    ADOPT = "adopt"
    #: Its reconcile, for a cancel that must know first (docs/protocol.md, "Operator actions").
    SETTLE = "settle"


class Cause(StrEnum):
    """What went wrong, as the engine tells errors apart (`cause_of`)."""

    #: The partner refused: nothing happened, and trying again cannot fix it.
    PERMANENT = "permanent"
    #: Try again later under the same key: a partner's 409/429/5xx, a timeout.
    TRANSIENT = "transient"
    #: Transient, and the request went: its answer was lost, the effect may have happened.
    ANSWER_LOST = "answer_lost"
    #: Transient: the database or a pooler failed a statement, not the step.
    DATABASE = "database"
    #: No turn at the partner (a limit, an open breaker, a pause): not the step's error.
    PARTNER_WAIT = "partner_wait"
    #: The step asks for a person.
    NEEDS_ATTENTION = "needs_attention"
    #: Its result is not JSON: it ran, and cannot be recorded.
    NOT_JSON = "not_json"
    #: A reconcile that cannot ask, for a partner that keeps no key.
    REPEAT_UNSAFE = "repeat_unsafe"
    #: A reconcile that could not tell.
    OUTCOME_UNKNOWN = "outcome_unknown"
    #: Anything else: a bug.
    BUG = "bug"
    #: The reconcile answered: it did not happen.
    ABSENT = "absent"
    #: There is no reconcile to ask.
    UNASKED = "unasked"
    #: The worker running the attempt died (the broker gave its message back).
    WORKER_LOST = "worker_lost"
    #: The rule deciding what the step waits for raised.
    WAIT_RULE = "wait_rule"


@dataclass(frozen=True, kw_only=True)
class Failure:
    """The plain facts a verdict depends on."""

    cause: Cause
    moment: Moment = Moment.RUN
    #: The step's name and kind (`StepKind`).
    step: str
    kind: str
    #: The error's text (`str(exc)`) and its type's name.
    detail: str = ""
    error_type: str = ""
    #: This attempt's number, and the bound on them (the step's retry policy, or for a lost
    #: worker AGENTFLOW_MAX_ATTEMPTS).
    attempt: int = 1
    max_attempts: int = 1
    #: The step has a reconcile that asks the partner.
    reconcile: bool = False
    #: A call of this attempt went to a limited partner and failed: a wait is no free wait.
    spent: bool = False
    #: The back-off before the next attempt (the policy's, or the partner's Retry-After).
    backoff_seconds: float = 0.0
    #: PARTNER_WAIT: whose turn, and how long until it is looked at again.
    partner: str = ""
    wait_seconds: float = 0.0
    #: TAKEOVER: the partner's idempotency window, and whether the first attempt is older.
    window_seconds: float | None = None
    too_old: bool = False
    #: ASK: the verdict that sent it to ask.
    asked: Ask | None = None
    #: WAIT_RULE: the step was claimed before and its effect may have happened.
    unsettled: bool = False

    @property
    def exhausted(self) -> bool:
        return self.attempt >= self.max_attempts

    @property
    def described(self) -> str:
        return self.detail or self.error_type


@dataclass(frozen=True, kw_only=True)
class Verdict:
    #: A bug, not a failure the engine expected: log its traceback.
    log_traceback: bool = False


@dataclass(frozen=True, kw_only=True)
class Retry(Verdict):
    """A retryable FAILED attempt: the run waits `delay_seconds`, then tries under the same
    key."""

    error: str
    delay_seconds: float


@dataclass(frozen=True, kw_only=True)
class Wait(Verdict):
    """No turn at the partner: the step waits for it, giving its attempt back. `unknown`: its
    call may have happened, and the next claim asks the partner first."""

    partner: str
    why: str
    seconds: float
    unknown: bool = False


@dataclass(frozen=True, kw_only=True)
class Ask(Verdict):
    """The call may have happened: ask the partner (the step's reconcile) before anything else.
    `retry_in_seconds`: proven absent, try again after that back-off; None: fail."""

    reason: str
    retry_in_seconds: float | None = None


@dataclass(frozen=True, kw_only=True)
class Park(Verdict):
    """Stop the run for a person: `reason` on the run and its event of `kind`; `error` in the
    event's data."""

    reason: str
    kind: str = RunEvent.Kind.NEEDS_ATTENTION
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class Fail(Verdict):
    """FAILED for good: the effect did not happen; the run compensates, then fails."""

    error: str


@dataclass(frozen=True, kw_only=True)
class Proceed(Verdict):
    """Go on as if nothing failed: run the step (again) under its key."""


def cause_of(exc: BaseException) -> Cause:
    """How the engine tells `exc` apart."""
    if isinstance(exc, PartnerWait):
        return Cause.PARTNER_WAIT
    if isinstance(exc, NotJSONError):
        return Cause.NOT_JSON
    if isinstance(exc, NeedsAttention):
        return Cause.NEEDS_ATTENTION
    if isinstance(exc, PermanentStepError):
        return Cause.PERMANENT
    if isinstance(exc, AnswerLost):
        return Cause.ANSWER_LOST
    if pooler.database_trouble(exc):
        return Cause.DATABASE
    if isinstance(exc, TRANSIENT):
        return Cause.TRANSIENT
    if isinstance(exc, RepeatUnsafe):
        return Cause.REPEAT_UNSAFE
    if isinstance(exc, OutcomeUnknown):
        return Cause.OUTCOME_UNKNOWN
    return Cause.BUG


#: Try again later under the same key.
RETRYABLE = frozenset({Cause.TRANSIENT, Cause.ANSWER_LOST, Cause.DATABASE})


def classify(failure: Failure) -> Retry | Wait | Ask | Park | Fail | Proceed:
    """What `failure` means; the reasons are the ones the run and its events show."""
    if failure.moment is Moment.RUN:
        return _attempt(failure)
    if failure.moment is Moment.TAKEOVER:
        return _takeover(failure)
    if failure.moment is Moment.ASK:
        return _asked(failure)
    if failure.moment is Moment.SETTLE:
        return _settle(failure)
    return unknown(failure.step, f"the partner has it but it cannot be recorded ({failure.detail})")


def _attempt(f: Failure) -> Retry | Wait | Ask | Park | Fail | Proceed:
    claimed = f.kind in CLAIMED_KINDS
    effect = f.kind == StepKind.EFFECT
    if f.cause is Cause.WORKER_LOST:
        return _worker_lost(f, claimed)
    if f.cause is Cause.WAIT_RULE:
        return _wait_rule(f)
    if f.cause is Cause.PARTNER_WAIT:
        if claimed and f.spent and f.exhausted:
            # A call of this attempt went and failed before the wait (a reconcile the partner
            # refused, a request not answered): the attempt was spent. At the bound it ends,
            # instead of waiting for ever for a partner that keeps failing.
            reason = f"gave up after {f.attempt} attempts: {f.detail}"
            return unknown(f.step, reason) if effect else Fail(error=reason)
        return Wait(partner=f.partner, why=f.detail, seconds=f.wait_seconds)
    if f.cause is Cause.NEEDS_ATTENTION:
        return Park(reason=f"{f.step}: {f.detail}", error=f.detail)
    if f.cause is Cause.NOT_JSON and claimed:
        # The call returned, so its effect may stand: a person decides.
        return Park(
            reason=f"{f.step} ran but its result cannot be recorded ({f.detail}); check the "
            "partner before retrying",
            error=f.detail,
        )
    if f.cause in (Cause.PERMANENT, Cause.NOT_JSON):
        return Fail(error=f.detail)
    if f.cause in RETRYABLE:
        return _retryable(f, effect)
    # A bug in a step is not transient: fail with a readable reason instead of looping.
    return _gave_up(f, f"unexpected {f.error_type}: {f.detail}", effect, log_traceback=True)


def _retryable(f: Failure, effect: bool) -> Retry | Ask | Park | Fail:
    retry_in = None if f.exhausted else f.backoff_seconds
    if f.cause is Cause.ANSWER_LOST and effect and f.reconcile:
        # The call went and its answer was lost: the retry asks first, as a takeover does;
        # never calls again blindly.
        return Ask(reason=f.described, retry_in_seconds=retry_in)
    if retry_in is not None:
        return Retry(error=f.described, delay_seconds=retry_in)
    reason = f"gave up after {f.attempt} attempts: {f.described}"
    if f.cause is not Cause.DATABASE:
        return _gave_up(f, reason, effect)
    # The database kept failing the engine's own statements: never the step's failure.
    if effect:
        return unknown(f.step, f"the database kept failing ({reason})")
    return Park(
        reason=f"{f.step}: the database kept failing ({reason}); retry once it is back",
        error=reason,
    )


def _gave_up(
    f: Failure, reason: str, effect: bool, *, log_traceback: bool = False
) -> Ask | Park | Fail:
    """The attempt ended without a result: an effect's call may have happened, so the
    partner is asked (or, with nobody to ask, a person); anything else changed nothing
    outside, and fails."""
    if not effect:
        return Fail(error=reason, log_traceback=log_traceback)
    if f.reconcile:
        return Ask(reason=reason, log_traceback=log_traceback)
    return unknown(f.step, reason, log_traceback=log_traceback)


def _worker_lost(f: Failure, claimed: bool) -> Park | Proceed:
    """Bounds the redelivery loop of a step that kills its worker every time."""
    if not f.exhausted:
        return Proceed()
    if not claimed:
        return Park(reason=f"{f.step} killed its worker {f.attempt} times")
    return Park(
        reason=f"outcome unknown: {f.step} was attempted {f.attempt} times without finishing "
        "(the worker kept dying); check the partner, then retry (it asks the partner first)",
        kind=RunEvent.Kind.OUTCOME_UNKNOWN,
        error="worker kept dying",
    )


def _wait_rule(f: Failure) -> Park | Fail:
    """Nothing of the step ran; but if it was claimed before (approved, or then needing no
    approval) its effect may have happened, which a failure would write off as never made
    (docs/protocol.md, "Unknown outcomes", "I8: money")."""
    why = f"deciding what it waits for raised {f.error_type}: {f.detail}"
    if f.unsettled:
        return Park(
            reason=f"outcome unknown: {f.step} may have taken effect, and {why}; fix that, "
            "then retry (it asks the partner first)",
            kind=RunEvent.Kind.OUTCOME_UNKNOWN,
            log_traceback=True,
        )
    return Fail(error=why, log_traceback=True)


def _takeover(f: Failure) -> Retry | Wait | Ask | Park | Fail | Proceed:
    """Inside the key window, the key protects a repeat the reconcile could not rule out;
    outside it, only a person can."""
    if f.cause is Cause.PARTNER_WAIT:
        return _attempt(f)  # its turn at the partner comes later: ask then
    if f.cause is Cause.REPEAT_UNSAFE:
        return unknown(f.step, f.described)  # no key makes a repeat safe
    if not f.too_old or f.cause is Cause.ABSENT:
        return Proceed()
    window = (
        "its first attempt is older than the partner's idempotency window "
        f"({f.window_seconds:.0f} s)"
    )
    if f.cause is Cause.UNASKED:
        return unknown(f.step, f"{window} and there is no way to ask the partner what happened")
    return unknown(
        f.step, f"{window} and the partner could not say whether it happened ({f.described})"
    )


def _asked(f: Failure) -> Retry | Wait | Park | Fail:
    reason = f.asked.reason if f.asked is not None else ""
    if f.cause is Cause.ABSENT:
        error = f"{reason} (the partner confirms it did not happen)"
        retry_in = f.asked.retry_in_seconds if f.asked is not None else None
        if retry_in is not None:
            return Retry(error=error, delay_seconds=retry_in)  # the next call is no repeat
        return Fail(error=error)
    if f.cause is Cause.REPEAT_UNSAFE:
        return unknown(f.step, f"{reason}; {f.described}")  # nothing can ask, nothing keys it
    could_not_say = f"{reason}; the partner could not say whether it happened"
    if f.cause is Cause.PARTNER_WAIT:
        if f.spent and f.exhausted:
            # The attempts are spent on a partner that keeps failing: ask no more.
            return unknown(f.step, f"{could_not_say} ({f.detail})")
        return Wait(partner=f.partner, why=f.detail, seconds=f.wait_seconds, unknown=True)
    return unknown(f.step, f"{could_not_say} ({f.described})")


def _settle(f: Failure) -> Retry | Wait | Ask | Park | Fail | Proceed:
    """Found, the effect is adopted (and then undone by the cancel); proven absent, the step
    fails and the cancel has nothing of it to undo; when the partner cannot tell, it is asked
    again after a back-off, then the run parks "outcome unknown"."""
    if f.cause is Cause.PARTNER_WAIT:
        return _attempt(f)
    if f.cause is Cause.UNASKED:
        return unknown(f.step, "the run was cancelled and there is no way to ask the partner")
    if f.cause is Cause.ABSENT:
        return Fail(
            error="cancelled before it took effect (the partner confirms it did not happen)"
        )
    if f.cause in RETRYABLE | {Cause.OUTCOME_UNKNOWN, Cause.REPEAT_UNSAFE} and not f.exhausted:
        return Retry(
            error=f"cancelled; asking whether it took effect: {f.described}",
            delay_seconds=f.backoff_seconds,
        )
    return unknown(
        f.step,
        f"the run was cancelled and the partner could not say whether it happened ({f.described})",
    )


def unknown(step: str, reason: str, *, log_traceback: bool = False) -> Park:
    """Parked "outcome unknown": the effect may stand, so a person's retry asks first."""
    return Park(
        reason=f"outcome unknown: {step} may or may not have taken effect: {reason}. "
        "Retry asks the partner first and never repeats it blindly.",
        kind=RunEvent.Kind.OUTCOME_UNKNOWN,
        error=reason,
        log_traceback=log_traceback,
    )
