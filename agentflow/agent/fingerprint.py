"""What identifies a durable call: its position, kind, name and canonical arguments.

Replay matches a call made now against the checkpoint at the same position. Matching by tool
name alone (the seed article's memo) would hand the first result of `fetch_booking` to a second
call with other arguments; matching by position and arguments cannot.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from agentflow.agent.canonical import canonical_json, digest, normalise

#: The checkpoint name of every model turn (tools and steps are named by their own names), so
#: `AGENTFLOW_CRASH_AT=llm:after_effect` reads naturally.
LLM_CALL_NAME = "llm"


class CallKind(StrEnum):
    LLM = "llm"
    TOOL = "tool"
    STEP = "step"


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """One call's identity. `arguments` is kept (normalised) so a divergence can show a diff."""

    position: int
    kind: CallKind
    name: str
    arguments: Any

    @property
    def digest(self) -> str:
        """SHA-256 of the canonical `[kind, name, arguments]`; position is the lookup key."""
        return digest([str(self.kind), self.name, self.arguments])

    def matches(self, other: Fingerprint) -> bool:
        """True when `other` is the same call, computed from the values on both sides."""
        return (
            self.position == other.position
            and self.kind == other.kind
            and self.name == other.name
            and canonical_json(self.arguments) == canonical_json(other.arguments)
        )

    def as_json(self) -> dict[str, Any]:
        """The stored form; `digest` is informational (matching recomputes it from values)."""
        return {
            "position": self.position,
            "kind": str(self.kind),
            "name": self.name,
            "arguments": self.arguments,
            "digest": self.digest,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fingerprint:
        return cls(
            position=int(data["position"]),
            kind=CallKind(data["kind"]),
            name=str(data["name"]),
            arguments=normalise(data["arguments"]),
        )

    def describe(self) -> str:
        """ "model turn" / "tool call charge_customer" / "step verify_ownership", for people."""
        if self.kind == CallKind.LLM:
            return f"model turn ({self.arguments.get('model', '?')})"
        return f"{'tool call' if self.kind == CallKind.TOOL else 'step'} {self.name}"


def llm_fingerprint(
    position: int, *, model: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> Fingerprint:
    """A model turn is the same call when the model, every message and every tool are."""
    return Fingerprint(
        position=position,
        kind=CallKind.LLM,
        name=LLM_CALL_NAME,
        arguments=normalise({"model": model, "messages": messages, "tools": tools}),
    )


def tool_fingerprint(position: int, name: str, arguments: Any) -> Fingerprint:
    """`arguments` as the model sent them (parsed), before validation: a call the registry
    refused is recorded, and replayed, like any other."""
    return Fingerprint(
        position=position, kind=CallKind.TOOL, name=name, arguments=normalise(arguments)
    )


def step_fingerprint(position: int, name: str, arguments: Any) -> Fingerprint:
    return Fingerprint(
        position=position, kind=CallKind.STEP, name=name, arguments=normalise(arguments)
    )
