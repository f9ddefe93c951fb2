"""Per-run turn and token limits, enforced by code before every new step (never by a prompt).

Pure: the replay loop counts turns and recorded token usage from the trajectory and asks here
before it runs anything new, so a run past its limit fails before any further effect and its
compensations run as for any permanent failure.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentflow.agent.errors import BudgetExceeded


@dataclass(frozen=True, kw_only=True)
class AgentLimits:
    max_turns: int
    max_tokens: int

    @classmethod
    def from_settings(cls) -> AgentLimits:
        from django.conf import settings

        return cls(
            max_turns=settings.AGENTFLOW_AGENT_MAX_TURNS,
            max_tokens=settings.AGENTFLOW_AGENT_MAX_TOKENS,
        )

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
