"""A model turn's request as a delta against the turn before it, and its digest as a chain.

A request holds the whole conversation so far, so storing each turn's request whole, or
hashing it whole on every replay, grows with the square of the run's length. A turn's
checkpoint keeps only what the conversation gained since the previous turn (`keep`: how many
of that turn's messages it starts with; `messages`: the ones after) and the tools only on a
replay's first turn; its digest chains each new message onto the previous turn's chain. So each
message is stored once and hashed once per replay, and the whole request is rebuilt, when a
person needs it, by reading the turns in order.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentflow._base.canonical import canonical_json, digest, normalise, unchanged
from agentflow.agent.fingerprint import (
    CHAIN_START,
    LLM_CALL_NAME,
    CallKind,
    Fingerprint,
    chain_link,
    turn_digest,
)


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One request, as the replay saw it: what it kept of the previous one, what it added."""

    model: str
    keep: int
    added: tuple[Any, ...]
    #: The tools, on a replay's first turn; None: the previous turn's.
    tools: tuple[Any, ...] | None
    digest: str

    def fingerprint(self, position: int) -> Fingerprint:
        """The stored form: the delta, and the chain's digest."""
        arguments: dict[str, Any] = {
            "model": self.model,
            "keep": self.keep,
            "messages": normalise(self.added),
        }
        if self.tools is not None:
            arguments["tools"] = normalise(self.tools)
        return Fingerprint(
            position=position,
            kind=CallKind.LLM,
            name=LLM_CALL_NAME,
            arguments=arguments,
            digest=self.digest,
        )


class Turns:
    """The model turns of one replay, in order.

    The messages a turn keeps from the previous one are found by identity (the function
    appends to its list, so they are the very objects hashed before) and only the rest are
    hashed. A message changed in place after it was hashed would go unseen that way, so
    `changed_in_place` checks every hashed message once at the end; a replay that finds one
    is run again `exact`: every turn's messages compared by their canonical text.
    """

    def __init__(self, tools: Sequence[Any], *, exact: bool = False) -> None:
        self._tools = tuple(tools)
        self._tools_digest = digest(self._tools)
        self._tools_size = len(canonical_json(list(self._tools)))
        self._sizes = [0]  # the bytes of its first i messages' canonical JSON, by i
        self._exact = exact
        self._sent: tuple[Any, ...] = ()  # the previous turn's messages (exact: their texts)
        self._chains = [CHAIN_START]  # the chain after each of its first i messages
        self._hashed: list[Any] = []  # each message hashed, and its text then
        self._texts: list[str] = []
        self._observed = 0
        self._latest: tuple[str, int, tuple[Any, ...], str] | None = None
        self._extends = False  # the latest request starts with every message of the one before

    def observe(self, model: str, messages: Sequence[Any]) -> str:
        """The digest of the request `messages` (and the tools) to `model`, after the turns
        observed before it; `latest` is that turn."""
        now = tuple(messages)
        texts = [canonical_json(m) for m in now] if self._exact else None
        keep = _kept(texts if texts is not None else now, self._sent, exact=self._exact)
        if texts is None:
            added = [canonical_json(m) for m in now[keep:]]
            self._hashed += now[keep:]
            self._texts += added
        else:
            added = texts[keep:]
        chains, sizes = self._chains, self._sizes
        del chains[keep + 1 :]  # a turn that only appends (the usual one) copies nothing
        del sizes[keep + 1 :]
        chain, size = chains[-1], sizes[-1]
        for text in added:
            chain = chain_link(chain, text)
            chains.append(chain)
            size += len(text)
            sizes.append(size)
        self._extends = bool(self._sent) and keep == len(self._sent)
        self._sent = tuple(texts) if texts is not None else now
        self._observed += 1
        found = turn_digest(model=model, chain=chain, tools_digest=self._tools_digest)
        self._latest = (model, keep, now, found)
        return found

    def latest_size(self) -> int:
        """The bytes of the latest request's messages and tools as canonical JSON (ASCII):
        what bounds its input tokens (`agentflow.agent.budget`)."""
        return self._sizes[-1] + self._tools_size

    def added_bytes(self, kept: int | None = None) -> int | None:
        """The bytes of the latest request's messages after its first `kept` (None: after the
        previous request's, and None when it does not start with all of them): what a bound
        from an earlier request's reported tokens still counts by bytes (`budget.prefix_bound`)."""
        if kept is None:
            if not self._extends:
                return None
            kept = self._latest[1] if self._latest is not None else 0
        if not 0 <= kept < len(self._sizes):
            return None
        return self._sizes[-1] - self._sizes[kept]

    def latest_messages(self) -> tuple[Any, ...]:
        """The latest request's messages, as the function sent them."""
        return self._latest[2] if self._latest is not None else ()

    @property
    def tools_digest(self) -> str:
        return self._tools_digest

    def latest(self) -> Turn:
        """The turn observed last, as its checkpoint stores it: built only for the call a
        replay makes, not for each one it returns from the record."""
        assert self._latest is not None
        model, keep, now, found = self._latest
        return Turn(
            model=model,
            keep=keep,
            added=now[keep:],
            tools=self._tools if self._observed == 1 else None,
            digest=found,
        )

    def changed_in_place(self) -> bool:
        """Was a message this replay hashed changed afterwards (so a later turn it was kept in
        may have been another request than its digest says)?"""
        return not unchanged(self._hashed, self._texts)


def _kept(now: Sequence[Any], sent: Sequence[Any], *, exact: bool) -> int:
    """How many of `sent` the request `now` starts with: the same objects (the same texts when
    `exact`), compared in C."""
    differs: Callable[[Any, Any], bool] = operator.ne if exact else operator.is_not
    if not any(map(differs, now, sent)):
        return min(len(now), len(sent))
    return list(map(differs, now, sent)).index(True)


def whole_request(arguments: Any, before: dict[str, Any] | None) -> dict[str, Any] | None:
    """A turn's whole request (`model`, `messages`, `tools`) from its stored arguments and the
    whole request of the turn before it in its branch (None for the first turn); None when the
    arguments are not in either recorded shape. A turn recorded whole (before deltas) has no
    `keep`: it keeps nothing."""
    if not isinstance(arguments, dict) or not isinstance(arguments.get("messages"), list):
        return None
    keep = arguments.get("keep", 0)
    if not isinstance(keep, int) or (keep and (before is None or keep > len(before["messages"]))):
        return None
    kept = before["messages"][:keep] if before is not None else []
    tools = arguments.get("tools", before["tools"] if before is not None else [])
    return {
        "model": arguments.get("model"),
        "messages": [*kept, *arguments["messages"]],
        "tools": tools,
    }
