"""The engine's errors. Fields are plain values so they pickle across process boundaries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentflow._base import rate_signals


class AgentflowError(Exception):
    """An agentflow error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class RetryableStepError(AgentflowError):
    """A transient failure: the step runs again later under the same idempotency key."""

    def __init__(self, message: str | None = None, *, retry_after_seconds: float | None = None):
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds

    def __reduce__(self):  # keep the keyword field when pickled
        return (_rebuild_retryable, (str(self), self.retry_after_seconds))


def _rebuild_retryable(message: str, retry_after_seconds: float | None) -> RetryableStepError:
    return RetryableStepError(message, retry_after_seconds=retry_after_seconds)


class AnswerLost(RetryableStepError):
    """The request went and its answer was lost (a timeout, a connection closed mid-call):
    the effect may have happened (docs/protocol.md, "Unknown outcomes"). Its retry goes by a
    takeover's rule: the step's reconcile asks first (found: adopted; proven absent: called again;
    cannot tell: the run parks "outcome unknown"); without a reconcile, the idempotency key protects
    the repeat."""

    def __reduce__(self):  # keep the class when pickled
        return (_rebuild_lost, (str(self), self.retry_after_seconds))


def _rebuild_lost(message: str, retry_after_seconds: float | None) -> AnswerLost:
    return AnswerLost(message, retry_after_seconds=retry_after_seconds)


class PermanentStepError(AgentflowError):
    """A failure that retrying cannot fix: the run fails (and compensates)."""


class NeedsAttention(AgentflowError):
    """Raised by a step whose run a person must look at before it goes on (a reconciliation
    that found a mismatch): the run parks NEEDS_ATTENTION with this message as its reason; an
    operator's Retry runs the step again, Cancel ends the run."""


class OutcomeUnknown(AgentflowError):
    """A reconcile could not tell whether the effect happened."""


class RepeatUnsafe(OutcomeUnknown):
    """A reconcile that cannot ask, for an effect whose partner keeps no idempotency key: the
    call may have happened and repeating it could make it twice, so the step parks "outcome
    unknown" for a person instead of calling again (docs/protocol.md, "Unknown outcomes")."""


class UnknownWorkflowError(AgentflowError):
    def __init__(self, name: str, known: list[str] | None = None) -> None:
        hint = f" (known: {', '.join(sorted(known))})" if known else ""
        super().__init__(f"no workflow named {name!r} is registered{hint}")
        self.name = name


class InvalidInputError(AgentflowError):
    """The workflow input is not JSON."""


class DefinitionError(AgentflowError):
    """A workflow definition is malformed."""


class PartnerRateLimited(RetryableStepError):
    """The partner refused the call for its rate limit (an HTTP 429): an answer, not a lost one.

    The partner did not act, so the attempt is no unknown outcome and needs no reconcile; the
    limiter slows the partner's key for every run (docs/partner-limits.md, "What happens").
    `reason`: what the partner named (Stripe's `Stripe-Rate-Limited-Reason`); `reset_seconds`: when
    its window frees up (`x-ratelimit-reset-*`), if it said.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        retry_after_seconds: float | None = None,
        reason: str = "",
        reset_seconds: float | None = None,
    ) -> None:
        super().__init__(message, retry_after_seconds=retry_after_seconds)
        self.reason = reason
        self.reset_seconds = reset_seconds

    @classmethod
    def from_headers(cls, message: str, headers: Mapping[str, Any] | None) -> PartnerRateLimited:
        """The 429 as the partner's headers describe it (`agentflow._base.rate_signals`)."""
        signal = rate_signals.read(headers)
        return cls(
            message,
            retry_after_seconds=signal.retry_after_seconds,
            reason=signal.reason,
            reset_seconds=signal.reset_seconds,
        )

    def __reduce__(self):
        return (
            _rebuild_rate_limited,
            (str(self), self.retry_after_seconds, self.reason, self.reset_seconds),
        )


def _rebuild_rate_limited(
    message: str, retry_after: float | None, reason: str, reset: float | None
) -> PartnerRateLimited:
    return PartnerRateLimited(
        message, retry_after_seconds=retry_after, reason=reason, reset_seconds=reset
    )


class PartnerUnavailable(RetryableStepError):
    """The partner timed out, could not be reached, or answered 5xx: what opens its breaker.

    Like any retryable error of an effect, the call may have happened
    (docs/protocol.md, "Unknown outcomes")."""

    def __reduce__(self):
        return (_rebuild_unavailable, (str(self), self.retry_after_seconds))


def _rebuild_unavailable(message: str, retry_after: float | None) -> PartnerUnavailable:
    return PartnerUnavailable(message, retry_after_seconds=retry_after)


def partner_wait_reason(partner: str, reason: str) -> str:
    """The sentence a step waiting for its turn at `partner` shows, on the run page and the
    partner page alike: "waiting for stripe: rate limit"."""
    return f"waiting for {partner}: {reason}"


class PartnerWait(AgentflowError):
    """Not the step's error: the limiter did not give the call its turn (a rate or concurrency
    limit, an open breaker, a pause). The step waits without holding a worker and spends no
    attempt; `wait_seconds` until it is looked at again, `reason` as the run shows it."""

    def __init__(self, partner: str, reason: str, wait_seconds: float) -> None:
        super().__init__(partner_wait_reason(partner, reason))
        self.partner, self.reason, self.wait_seconds = partner, reason, wait_seconds

    def __reduce__(self):
        return (PartnerWait, (self.partner, self.reason, self.wait_seconds))
