"""Per-run caps on model tokens and dollars that hold across crashes, checked by code before
every model request (never by a prompt).

Before a request the replay knows three figures: what the recorded turns spent (their usage
and recorded cost), what the requests whose answers were lost may have cost, and what this
request could cost at most. A request is claimed (its IN_PROGRESS checkpoint committed, its
attempt counted) before it is sent, so every attempt of a model turn that recorded no answer
is a request that may have been billed in full: a worker killed after sending it, a timeout,
a server that dropped the connection. The record cannot tell which of them a provider billed,
so each counts at its worst case: its output at most the `max_tokens` it was sent with, its
input at most what `input_bound` proves (below). The run goes on only while
spent + lost + this request's worst case stays within the caps; a crash loop around a lost
answer therefore cannot spend past them, however often it repeats.

Input tokens are bounded without a tokenizer (none that covers the providers' encodings ships
its data offline; tiktoken downloads its files at first use): a byte-level BPE tokenizer
(o200k, cl100k, Llama's) never makes more than one token of a byte, and the canonical JSON of a
message spends more bytes on quotes and keys than the chat format spends tokens on its frame.
That alone counts a request at about four times its tokens, so it is tightened by what the
provider already reported: a chat request is rendered message by message, each framed by
special tokens, so a recorded request's `prompt_tokens` is exactly what its messages (and the
tools) cost again in any later request to the same server and model that starts with them
(`prefix_bound`): only the messages added since are counted by their bytes. The previous turn
of the run is such a request for the next one; for a run's first turn, a first turn of another
run of the workflow that began with the same messages (the system prompt) and tools.

Pure, like `limits`: the loop counts, this module decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from agentflow._base.canonical import canonical_json
from agentflow._conf import settings
from agentflow.agent import pricing
from agentflow.exceptions import BudgetExceeded

#: Tokens a chat request costs beyond its text (the chat format's per-request priming), added
#: to every worst case so that a request of a few bytes still counts its frame.
REQUEST_OVERHEAD_TOKENS = 16
#: What a workflow may say happens when a request could pass a cap: the run parks "budget
#: reached" for an operator (nothing is undone: it can be resumed once the cap is raised), or
#: it fails and its compensations run.
ON_REACHED = ("park", "fail")


@dataclass(frozen=True, kw_only=True)
class Caps:
    max_tokens: int
    #: None: no dollar cap.
    max_cost_usd: Decimal | None
    on_reached: str = "park"

    @classmethod
    def for_workflow(cls, workflow: Any) -> Caps:
        """The settings' caps, each replaced by the workflow's own when it declares one."""
        tokens = getattr(workflow, "max_tokens", None)
        cost = getattr(workflow, "max_cost_usd", None)
        if cost is None:
            cost = settings.AGENTFLOW_AGENT_MAX_COST_USD
        return cls(
            max_tokens=int(tokens or settings.AGENTFLOW_AGENT_MAX_TOKENS),
            max_cost_usd=None if cost is None else Decimal(str(cost)),
            on_reached=getattr(workflow, "on_budget", "park") or "park",
        )


@dataclass(frozen=True, kw_only=True)
class WorstCase:
    """The most one request can cost: tokens, and dollars (None: its model has no price)."""

    input_tokens: int
    output_tokens: int
    cost_usd: Decimal | None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


def request_bytes(messages: Sequence[Any], tools: Sequence[Any]) -> int:
    """The bytes a request's worst case is counted from: each message's canonical JSON and
    the tools' (what `Turns.latest_size` keeps as it goes, without re-reading the messages)."""
    return sum(len(canonical_json(m)) for m in messages) + len(canonical_json(list(tools)))


def input_bound(request_bytes: int) -> int:
    """The most input tokens a request of `request_bytes` of canonical JSON (ASCII) can be: a
    tokenizer never makes more than one token of a byte of text, and JSON spends more bytes on
    quotes, keys and escapes than the chat format spends tokens on its frame."""
    return request_bytes + REQUEST_OVERHEAD_TOKENS


def prefix_bound(prompt_tokens: int, added_bytes: int) -> int:
    """The most input tokens a request can be that starts with every message of a recorded
    request (the same tools, server and model) whose server reported `prompt_tokens`, and adds
    messages of `added_bytes` of canonical JSON after them: the recorded messages cost what they
    cost then (each message is rendered apart, between special tokens), the new ones at most
    a token a byte."""
    return prompt_tokens + added_bytes


def worst_case(
    *,
    model: str,
    provider: str,
    max_tokens: int,
    request_bytes: int | None = None,
    input_tokens: int | None = None,
) -> WorstCase:
    """A request to `model` answered with at most `max_tokens`, its input bounded by
    `input_tokens` or else from its `request_bytes` (`input_bound`)."""
    if input_tokens is None:
        assert request_bytes is not None
        input_tokens = input_bound(request_bytes)
    return WorstCase(
        input_tokens=input_tokens,
        output_tokens=max_tokens,
        cost_usd=pricing.cost_usd(
            model=model, input_tokens=input_tokens, output_tokens=max_tokens, provider=provider
        ),
    )


def chain_worst_case(
    chain: Sequence[tuple[str, str]],
    *,
    max_tokens: int,
    request_bytes: int | None = None,
    inputs: Sequence[int] | None = None,
) -> WorstCase:
    """The most one attempt can cost when it may ask each (model, provider) of `chain` in
    turn (a fallback chain, `agent.fallbacks`): every one of them may bill it in full.
    `inputs`: each one's input bound, else all from `request_bytes`."""
    cases = [
        worst_case(
            model=model,
            provider=provider,
            max_tokens=max_tokens,
            request_bytes=request_bytes,
            input_tokens=inputs[index] if inputs is not None else None,
        )
        for index, (model, provider) in enumerate(chain)
    ]
    costs = [case.cost_usd for case in cases if case.cost_usd is not None]
    return WorstCase(
        input_tokens=sum(case.input_tokens for case in cases),
        output_tokens=sum(case.output_tokens for case in cases),
        cost_usd=sum(costs, Decimal(0)) if len(costs) == len(cases) else None,
    )


class Ledger:
    """One replay's count of what the run's model requests spent or may have spent."""

    def __init__(self) -> None:
        self.spent_tokens = 0
        self.spent_usd = Decimal(0)
        self.lost_tokens = 0
        self.lost_usd = Decimal(0)
        self.lost_requests = 0
        #: Models of requests that have no price (spent or lost): no dollar figure is whole.
        self.unpriced: set[str] = set()

    def spent(self, *, tokens: int, cost_usd: Decimal | None, model: str) -> None:
        """A recorded turn's usage and cost."""
        self.spent_tokens += tokens
        if cost_usd is None:
            self.unpriced.add(model or "?")
        else:
            self.spent_usd += cost_usd

    def lost(self, worst: WorstCase, *, requests: int, model: str) -> None:
        """`requests` sent for a turn that recorded no answer for them: each at its worst."""
        if requests <= 0:
            return
        self.lost_requests += requests
        self.lost_tokens += worst.tokens * requests
        if worst.cost_usd is None:
            self.unpriced.add(model or "?")
        else:
            self.lost_usd += worst.cost_usd * requests

    def check(self, caps: Caps, next_request: WorstCase, *, model: str) -> None:
        """Before sending `next_request`.

        Raises:
            BudgetExceeded: it could take the run past a cap (`limit` "tokens" or "cost"), or
                the run has a dollar cap and a model without a price (`limit` "cost": its
                spend cannot be bounded, and is never counted as zero).
        """
        tokens = self.spent_tokens + self.lost_tokens + next_request.tokens
        if tokens > caps.max_tokens:
            raise self._reached(caps, "tokens", next_request)
        if caps.max_cost_usd is None:
            return
        unpriced = self.unpriced | ({model or "?"} if next_request.cost_usd is None else set())
        if unpriced:
            raise self._reached(caps, "cost", next_request, unpriced=sorted(unpriced))
        assert next_request.cost_usd is not None
        if self.spent_usd + self.lost_usd + next_request.cost_usd > caps.max_cost_usd:
            raise self._reached(caps, "cost", next_request)

    def _reached(
        self,
        caps: Caps,
        limit: str,
        next_request: WorstCase,
        *,
        unpriced: list[str] | None = None,
    ) -> BudgetExceeded:
        figures: dict[str, Any] = {
            "limit": limit,
            "spent_tokens": self.spent_tokens,
            "lost_requests": self.lost_requests,
            "lost_tokens": self.lost_tokens,
            "next_request_tokens": next_request.tokens,
            "max_tokens": caps.max_tokens,
            "spent_usd": pricing.as_text(self.spent_usd),
            "lost_usd": pricing.as_text(self.lost_usd),
            "next_request_usd": pricing.as_text(next_request.cost_usd),
            "max_cost_usd": pricing.as_text(caps.max_cost_usd),
        }
        if unpriced:
            figures["unpriced_models"] = list(unpriced)
            message = (
                f"Budget reached: this run may spend at most ${caps.max_cost_usd} and "
                f"{', '.join(unpriced)} has no price, so what it spends cannot be bounded; "
                "nothing further was asked."
            )
        elif limit == "tokens":
            message = (
                f"Budget reached: {self.spent_tokens:,} tokens spent"
                + self._lost_text(f"{self.lost_tokens:,} tokens")
                + f", and the next request could take up to {next_request.tokens:,} more, "
                f"past the limit of {caps.max_tokens:,}; nothing further was asked."
            )
        else:
            message = (
                f"Budget reached: ${pricing.as_text(self.spent_usd)} spent"
                + self._lost_text(f"${pricing.as_text(self.lost_usd)}")
                + f", and the next request could cost up to "
                f"${pricing.as_text(next_request.cost_usd)} more, past the limit of "
                f"${pricing.as_text(caps.max_cost_usd)}; nothing further was asked."
            )
        used = self.spent_tokens + self.lost_tokens
        return BudgetExceeded(
            message, limit=limit, used=used, allowed=caps.max_tokens, figures=figures
        )

    def _lost_text(self, amount: str) -> str:
        if not self.lost_requests:
            return ""
        plural = "s" if self.lost_requests != 1 else ""
        return (
            f" (with up to {amount} for {self.lost_requests} request{plural} whose answer was lost)"
        )
