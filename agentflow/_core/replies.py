"""What a decision on a call tells the person the run serves, kept apart from the decider's reason.

An operator's reason is internal: the event log and the admin keep it with their username. When
the customer is to be told of the decision, the call declares the sentences they may be told
(`Replies`: the domain's own, per outcome, the first the default) and whether the operator may
write their own instead; the admin offers them in a field labelled as going to the customer and
shows a preview before the decision is made. The decision records the words chosen as its
`reply` (`Decision.reply`); a domain tells its customer those, never the reason or the name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agentflow.exceptions import DefinitionError

#: The longest reply an operator may write (a few sentences: it goes into an e-mail line).
REPLY_MAX_CHARS = 500


@dataclass(frozen=True, init=False)
class Replies:
    """The sentences a decision on this call may tell the customer, per outcome.

        Replies(approve=["Approved: no fee."], reject=["We couldn't waive the fee."])

    The first of each outcome is the default (what a decision made without choosing says);
    `own_words` lets the operator type one instead, which they see in a preview first.
    """

    approve: tuple[str, ...]
    reject: tuple[str, ...]
    own_words: bool

    def __init__(
        self, *, approve: Iterable[str], reject: Iterable[str], own_words: bool = True
    ) -> None:
        for outcome, sentences in (("approve", approve), ("reject", reject)):
            if isinstance(sentences, str) or not sentences:
                raise DefinitionError(f"Replies: {outcome}= is a list of at least one sentence")
            if not all(isinstance(s, str) and s.strip() for s in sentences):
                raise DefinitionError(f"Replies: every {outcome}= sentence is non-empty text")
        object.__setattr__(self, "approve", tuple(approve))
        object.__setattr__(self, "reject", tuple(reject))
        object.__setattr__(self, "own_words", bool(own_words))

    def offered(self, *, approved: bool) -> tuple[str, ...]:
        return self.approve if approved else self.reject


def own_words(text: str) -> str:
    """An operator's own reply as the customer reads it: one paragraph, trimmed."""
    return " ".join(text.split())[:REPLY_MAX_CHARS]
