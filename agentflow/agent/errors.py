"""Agent-mode errors, under the engine's root error. Fields are plain values (they pickle)."""

from __future__ import annotations

from typing import Any

from agentflow.exceptions import AgentflowError, PartnerUnavailable, PermanentStepError


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
