"""Every error agentflow raises to its users, under one root, `AgentflowError` (`durable` and
`agent` re-export the ones their callers catch). Fields are plain values so they pickle across
process boundaries."""

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


# --- what an operator or a caller asked for, refused ------------------------------------------
class ActionRefused(AgentflowError):
    """The run is not in a state where this action is safe."""


class Replayed(ActionRefused):
    """This signed webhook request was accepted before: the same bytes sent again."""


# --- schedules, privacy -----------------------------------------------------------------------
class ScheduleError(AgentflowError):
    """A schedule's declaration is not usable (its cron, time zone, window or overlap)."""


class ErasureRefused(AgentflowError):
    """Erasure cannot happen now; the message says why and what to do."""


class MasterKeyError(AgentflowError):
    """A master key setting that cannot be used, or a value no listed master key opens."""


# --- agent mode -------------------------------------------------------------------------------
class ToolRefused(AgentflowError):
    """A tool would not act on these arguments and did nothing.

    The message goes back to the model as the tool's result (recorded like any result), so the
    model can correct itself: a missing earlier call, say. A request that must never be made
    (a second charge) is a PermanentStepError instead: the run fails and compensates.
    """


class BudgetExceeded(PermanentStepError):
    """The run reached its turn, token or dollar limit: it fails (or parks, where its workflow
    says so) before any further step. `figures`: what was spent, lost and asked, for people."""

    def __init__(
        self,
        message: str,
        *,
        limit: str,
        used: int,
        allowed: int,
        figures: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.limit, self.used, self.allowed = limit, used, allowed
        self.figures = dict(figures or {})

    def __reduce__(self):  # keep the keyword fields when pickled
        return (
            _rebuild_budget,
            (str(self), self.limit, self.used, self.allowed, self.figures),
        )


def _rebuild_budget(
    message: str, limit: str, used: int, allowed: int, figures: dict[str, Any] | None = None
) -> BudgetExceeded:
    return BudgetExceeded(message, limit=limit, used=used, allowed=allowed, figures=figures)


class ToolServerUnavailable(PartnerUnavailable):
    """A server the run's tools come from (an MCP server, `agent.mcp_tools`) could not say
    which tools it has: not started yet, crashed, not answering. A partner's outage, not the
    run's error: the run waits on partner key `partner` (`mcp:<server name>`) and replays once
    the server can be listed; its breaker, where AGENTFLOW_PARTNER_LIMITS names the key, is the
    limiter's."""

    def __init__(self, partner: str, message: str, *, retry_after_seconds: float) -> None:
        super().__init__(message, retry_after_seconds=retry_after_seconds)
        self.partner = partner

    def __reduce__(self):
        return (_rebuild_server, (self.partner, str(self), self.retry_after_seconds))


def _rebuild_server(partner: str, message: str, retry_after: float) -> ToolServerUnavailable:
    return ToolServerUnavailable(partner, message, retry_after_seconds=retry_after)


class MCPUnavailable(AgentflowError):
    """The `mcp` package is not installed."""

    def __init__(self) -> None:
        super().__init__("MCP tools need the mcp SDK: pip install 'django-agentflow[mcp]'")
