"""What identifies a durable call: its position, kind, name and canonical arguments.

Replay matches a call made now against the checkpoint at the same position. Matching by tool
name alone would hand the first result of `fetch_booking` to a second
call with other arguments; matching by position and arguments cannot.

A model turn's arguments are the model, every message and every tool. Hashing them whole on
every turn of every replay costs the square of the run's length, so a turn's digest is a hash
chain: each message is hashed once, onto the chain of the messages before it. The chain after
the last message stands for the whole conversation (changing any earlier message changes it),
and so does the digest for the whole request.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agentflow._base.canonical import canonical_json, digest, normalise, plain

#: The checkpoint name of every model turn (tools and steps are named by their own names), so
#: `AGENTFLOW_CRASH_AT=llm:after_effect` reads naturally.
LLM_CALL_NAME = "llm"
#: The chain of an empty conversation.
CHAIN_START = hashlib.sha256(b"agentflow messages").hexdigest()


class CallKind(StrEnum):
    LLM = "llm"
    TOOL = "tool"
    STEP = "step"


_KINDS = {str(kind): kind for kind in CallKind}  # a dict's lookup: an enum's call is slower


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """One call's identity: `digest` decides, `arguments` is kept to show a diff. A model
    turn's `arguments` are as stored: its request as a delta (see `agentflow.agent.turns`)."""

    position: int
    kind: CallKind
    name: str
    arguments: Any
    digest: str

    def matches(self, other: Fingerprint) -> bool:
        """True when `other` is the same call."""
        return (
            self.position == other.position
            and self.kind == other.kind
            and self.name == other.name
            and self.digest == other.digest
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "kind": str(self.kind),
            "name": self.name,
            "arguments": self.arguments,
            "digest": self.digest,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fingerprint:
        """A recorded fingerprint, its digest as recorded (the digest of the canonical values
        when they were recorded), except a model turn recorded whole, before deltas (no
        `keep`): its digest then named the whole request, so its chain is computed from its
        messages."""
        position, kind, name = int(data["position"]), _KINDS[data["kind"]], str(data["name"])
        arguments = data["arguments"]
        if kind != CallKind.LLM or "keep" in arguments:
            return cls(
                position=position, kind=kind, name=name, arguments=arguments, digest=data["digest"]
            )
        return llm_fingerprint(
            position,
            model=arguments["model"],
            messages=arguments["messages"],
            tools=arguments["tools"],
        )

    def describe(self) -> str:
        """ "model turn" / "tool call charge_customer" / "step verify_ownership", for people."""
        if self.kind == CallKind.LLM:
            return f"model turn ({self.arguments.get('model', '?')})"
        return f"{'tool call' if self.kind == CallKind.TOOL else 'step'} {self.name}"


def chain_link(chain: str, text: str) -> str:
    """The chain after a message (`text`: its canonical JSON), given the chain before it."""
    return hashlib.sha256(f"{chain}{text}".encode("ascii")).hexdigest()


def turn_digest(*, model: str, chain: str, tools_digest: str) -> str:
    """A model turn is the same call when the model, the conversation (its chain) and the
    tools are. Two digests of fixed length, then the model's name: one way to read it."""
    return hashlib.sha256(f"llm{chain}{tools_digest}{model}".encode()).hexdigest()


def llm_fingerprint(
    position: int, *, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> Fingerprint:
    """A model turn from its whole request: what a divergence diffs, and how a turn recorded
    before deltas reads."""
    chain = CHAIN_START
    for message in messages:
        chain = chain_link(chain, canonical_json(message))
    return Fingerprint(
        position=position,
        kind=CallKind.LLM,
        name=LLM_CALL_NAME,
        arguments=normalise({"model": model, "messages": messages, "tools": tools}),
        digest=turn_digest(model=model, chain=chain, tools_digest=digest(tools)),
    )


def tool_fingerprint(position: int, name: str, arguments: Any) -> Fingerprint:
    """`arguments` as the model sent them (parsed), before validation: a call the registry
    refused is recorded, and replayed, like any other."""
    return _of_values(position, CallKind.TOOL, name, plain(arguments))


def step_fingerprint(position: int, name: str, arguments: Any) -> Fingerprint:
    return _of_values(position, CallKind.STEP, name, plain(arguments))


def call_digest(kind: CallKind, name: str, arguments: Any) -> str:
    """The digest of a tool call's or a step's fingerprint, without the fingerprint: what a
    replay compares with the recorded one."""
    return digest([str(kind), name, arguments])


def _of_values(position: int, kind: CallKind, name: str, arguments: Any) -> Fingerprint:
    return Fingerprint(
        position=position,
        kind=kind,
        name=name,
        arguments=arguments,
        digest=call_digest(kind, name, arguments),
    )
