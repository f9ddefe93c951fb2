"""Per-run limits on turns, tokens and tool calls, enforced by code before every new step
(never by a prompt).

Pure: the replay loop counts turns, recorded token usage and tool calls from the trajectory and
asks here before it runs anything new. A run past its turn or token limit fails before any
further effect and its compensations run as for any permanent failure; a tool call past the
per-turn or per-run cap is refused (the model reads why) and does nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentflow._conf import settings
from agentflow.exceptions import BudgetExceeded

#: Tool calls one model turn may have run: a turn asking for sixty gets the first ten.
DEFAULT_TOOL_CALLS_PER_TURN = 10


@dataclass(frozen=True, kw_only=True)
class AgentLimits:
    max_turns: int
    max_tokens: int
    #: Tool calls a run may have run, over all its turns.
    max_tool_calls: int
    max_tool_calls_per_turn: int = DEFAULT_TOOL_CALLS_PER_TURN

    @classmethod
    def from_settings(cls, *, max_tool_calls_per_turn: int | None = None) -> AgentLimits:
        return cls(
            max_turns=settings.AGENTFLOW_AGENT_MAX_TURNS,
            max_tokens=settings.AGENTFLOW_AGENT_MAX_TOKENS,
            max_tool_calls=settings.AGENTFLOW_AGENT_MAX_TOOL_CALLS,
            max_tool_calls_per_turn=min(
                max_tool_calls_per_turn or DEFAULT_TOOL_CALLS_PER_TURN,
                settings.AGENTFLOW_AGENT_MAX_TOOL_CALLS,
            ),
        )

    def tool_call_refusal(self, *, in_turn: int, in_run: int) -> str | None:
        """Why a tool call may not run, or None: it is the `in_turn`-th call of its turn, and
        `in_run` calls of the run ran before it."""
        if in_turn > self.max_tool_calls_per_turn:
            return (
                f"one turn may make at most {self.max_tool_calls_per_turn} tool calls; this was "
                f"call {in_turn} of the turn"
            )
        if in_run >= self.max_tool_calls:
            return f"this run has made all {self.max_tool_calls} of the tool calls it may make"
        return None

    def check_turn(self, *, turns_taken: int, tokens_used: int) -> None:
        """Before asking the model again: `turns_taken` turns are recorded already.

        Raises:
            BudgetExceeded: no turn is left, or the tokens are spent.
        """
        if turns_taken >= self.max_turns:
            raise BudgetExceeded(
                f"The agent used all {self.max_turns} of its model turns without finishing.",
                limit="turns",
                used=turns_taken,
                allowed=self.max_turns,
            )
        self.check_tokens(tokens_used=tokens_used)

    def check_tokens(self, *, tokens_used: int) -> None:
        """Before any new step (a tool call too): the recorded turns spent `tokens_used`.

        Raises:
            BudgetExceeded: the run has spent more tokens than it may.
        """
        if tokens_used > self.max_tokens:
            raise BudgetExceeded(
                f"The agent spent {tokens_used:,} tokens, over its limit of "
                f"{self.max_tokens:,}; nothing further was done.",
                limit="tokens",
                used=tokens_used,
                allowed=self.max_tokens,
            )
