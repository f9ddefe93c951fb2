"""What a step function sees: its run, its idempotency key, and the outputs before it."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


def idempotency_key(run_id: str, seq: int, branch: int = 0) -> str:
    """docs/protocol.md, "The idempotency key", exactly: the same for every attempt of the step. An
    agent run forked by an operator names the branch in the keys of its new calls, so none collides
    with a key a partner already saw for another call."""
    if branch:
        return f"{run_id}_b{branch}_step_{seq}"
    return f"{run_id}_step_{seq}"


@dataclass(frozen=True, kw_only=True)
class UndoneCall:
    """The exact call a compensation undoes, as recorded, from whatever branch it ran in: a
    compensation reads the effect here and never looks it up by name
    (docs/protocol.md, "Operator actions")."""

    name: str
    seq: int
    #: The branch it ran in (the run's current one, or one an operator's fork set aside).
    branch: int
    status: str
    arguments: Any
    #: Its recorded output (for a tool call, the tool's result).
    output: Any
    idempotency_key: str


@dataclass(frozen=True, kw_only=True)
class Decision:
    """An operator's answer to a call that waited for approval
    (docs/workflows.md, "Timers, signals and approvals"), as recorded at the call's position: a step
    that runs after it reads who approved it and why.

    `actor` and `reason` are internal (the event log, the admin); `reply` is what the decision
    tells the person the run serves, chosen from the call's declared `Replies` or written by the
    operator and previewed (agentflow._core.replies): "" when it says nothing (then the domain's own
    default sentence for the outcome is theirs to tell).
    """

    approved: bool
    actor: str
    reason: str
    #: Nobody decided within `AGENTFLOW_APPROVAL_TIMEOUT`: the reject path (never approved).
    timed_out: bool = False
    reply: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "approved": self.approved,
            "actor": self.actor,
            "reason": self.reason,
            "timed_out": self.timed_out,
            "reply": self.reply,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Decision:
        return cls(
            approved=bool(data.get("approved")),
            actor=str(data.get("actor", "")),
            reason=str(data.get("reason", "")),
            timed_out=bool(data.get("timed_out")),
            reply=str(data.get("reply") or ""),
        )


class StepContext:
    """Passed to every step, reconcile and compensation function.

    Earlier outputs are loaded on first use, so steps that do not read them cost no query.
    """

    __slots__ = (
        "_load_calls",
        "_load_outputs",
        "_lost",
        "_outputs",
        "attempt",
        "decision",
        "idempotency_key",
        "input",
        "run_id",
        "seq",
        "step",
        "undoes",
        "workflow",
    )

    def __init__(
        self,
        *,
        run_id: str,
        workflow: str,
        seq: int,
        step: str,
        attempt: int,
        input: Any,
        load_outputs: Callable[[], dict[str, Any]],
        key: str | None = None,
        undoes: UndoneCall | None = None,
        load_calls: Callable[[], Sequence[Any]] | None = None,
        decision: Decision | None = None,
    ) -> None:
        self.run_id = run_id
        self.workflow = workflow
        self.seq = seq
        self.step = step
        self.attempt = attempt
        self.input = input
        self.idempotency_key = key or idempotency_key(run_id, seq)
        #: A compensation's: the call it undoes (None for every other step).
        self.undoes = undoes
        #: A step declared `requires_approval`: the approval it runs under (None otherwise).
        self.decision = decision
        self._load_outputs = load_outputs
        self._load_calls = load_calls
        self._outputs: dict[str, Any] | None = None
        self._lost = threading.Event()

    @property
    def outputs(self) -> dict[str, Any]:
        """Recorded outputs of the completed steps before this one, by step name."""
        if self._outputs is None:
            self._outputs = self._load_outputs()
        return self._outputs

    def output_of(self, step: str, default: Any = None) -> Any:
        return self.outputs.get(step, default)

    def recorded_calls(self) -> Sequence[Any]:
        """The run's checkpoints before this step on its current branch, in order, as the
        engine recorded them (a code-first compensation rebuilds its tool's history from
        them). Read from the store on every call; the engine hands the reader in."""
        if self._load_calls is None:
            raise RuntimeError(f"{self!r} was made without the run's recorded calls")
        return self._load_calls()

    @property
    def lease_lost(self) -> bool:
        """True once another worker has taken this step over; a long step should stop."""
        return self._lost.is_set()

    def mark_lease_lost(self) -> None:
        self._lost.set()

    def __repr__(self) -> str:
        return f"<StepContext {self.idempotency_key} {self.step} attempt={self.attempt}>"
