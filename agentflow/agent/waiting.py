"""Durable time and people in agent runs (docs/workflows.md, "Timers, signals and approvals"):
`ctx.sleep`, `ctx.sleep_until`, `ctx.wait_for`, and the approval a tool call waits for.

Each wait is a durable call at its position like any other: the first replay that reaches it
records the wait and the run goes WAITING; once it is over (the time came, the signal or the
decision arrived, or a timeout) its outcome is that position's recorded result, and every later
replay returns it without waiting again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from agentflow._base.context import StepContext
from agentflow._base.states import StepKind, WaitKind
from agentflow._core.registry import StepDef, WaitSpec
from agentflow.agent.tools import PreparedCall
from agentflow.exceptions import DefinitionError

#: The checkpoint names of the waits (a signal's name follows the colon).
SLEEP_CALL = "sleep"
SIGNAL_CALL = "wait_for"


@dataclass(frozen=True, kw_only=True)
class Waited:
    """What `ctx.wait_for` returns: the signal's payload, or `timed_out` when none came in
    time."""

    payload: Any = None
    timed_out: bool = False

    @classmethod
    def from_json(cls, outcome: Any) -> Waited:
        outcome = outcome if isinstance(outcome, dict) else {}
        return cls(payload=outcome.get("payload"), timed_out=bool(outcome.get("timed_out")))


@dataclass(frozen=True, kw_only=True)
class WaitCall:
    """A wait as a durable call: its checkpoint name, fingerprinted arguments and the wait."""

    name: str
    arguments: dict[str, Any]
    spec: WaitSpec
    #: Where the wait is only known once the run gets there (a parent's children, counted
    #: then): what the engine asks instead of `spec`.
    waits_for: Callable[[StepContext], WaitSpec] | None = None


def sleep_call(*, seconds: float | None = None, until: datetime | None = None) -> WaitCall:
    """`ctx.sleep(seconds)` (from when the run first gets there) or `ctx.sleep_until(when)`."""
    if until is not None:
        if not isinstance(until, datetime) or until.tzinfo is None:
            raise DefinitionError("sleep_until needs an aware datetime (with a time zone)")
        return WaitCall(
            name=SLEEP_CALL,
            arguments={"until": until.isoformat()},
            spec=WaitSpec(kind=WaitKind.TIMER, name=SLEEP_CALL, until=until),
        )
    if seconds is None or isinstance(seconds, bool) or not float(seconds) >= 0:
        raise DefinitionError(f"sleep needs seconds of 0 or more, not {seconds!r}")
    return WaitCall(
        name=SLEEP_CALL,
        arguments={"seconds": float(seconds)},
        spec=WaitSpec(kind=WaitKind.TIMER, name=SLEEP_CALL, seconds=float(seconds)),
    )


def signal_call(name: str, timeout: float | None) -> WaitCall:
    """`ctx.wait_for(name, timeout=...)`: timeout None waits until the signal comes."""
    if not isinstance(name, str) or not name:
        raise DefinitionError(f"wait_for needs a signal name, not {name!r}")
    if timeout is not None and (isinstance(timeout, bool) or not float(timeout) > 0):
        raise DefinitionError(f"wait_for {name!r}: timeout must be above 0, not {timeout!r}")
    seconds = float(timeout) if timeout is not None else None
    return WaitCall(
        name=f"{SIGNAL_CALL}:{name}",
        arguments={"signal": name, "timeout": seconds},
        spec=WaitSpec(kind=WaitKind.SIGNAL, name=name, seconds=seconds),
    )


def rejected_result(decision: dict[str, Any]) -> dict[str, Any]:
    """A rejected (or timed-out) call's recorded outcome: the tool did not run, and the model
    reads why (the internal reason) and what the customer is told of it (the reply)."""
    return {
        "ok": False,
        "result": {
            "rejected": True,
            "reason": decision.get("reason", ""),
            "timed_out": bool(decision.get("timed_out")),
            "reply": str(decision.get("reply") or ""),
        },
    }


def timed_out(kind: str, output: Any) -> bool:
    """A recorded tool call whose approval timed out: it ran nothing (recorded as a `read`)
    and no operator decided it. A timeout is not a decision, so a fork's byte-identical call
    asks again rather than adopting it (as `store.waits` does for graph steps)."""
    result = output.get("result") if isinstance(output, dict) else None
    return (
        kind == StepKind.READ
        and isinstance(output, dict)
        and output.get("ok") is False
        and isinstance(result, dict)
        and result.get("rejected") is True
        and result.get("timed_out") is True
    )


def with_approval(step: StepDef, prepared: PreparedCall) -> StepDef:
    """`step` (the tool call as the run's next step), waiting first for approval of exactly
    this call when its tool requires it: its arguments, and what else its tool shows the
    operator (`approval_arguments`, the call's own arguments winning). A refused call runs
    nothing and a call adopted from a superseded branch acts no more, so neither waits."""
    tool = prepared.tool
    if tool is None or prepared.refused is not None or not tool.requires_approval:
        return step
    if isinstance(step.arguments, dict) and "reused" in step.arguments:
        return step
    values = dict(prepared.values)
    if not tool.needs_approval(values):
        return step
    shown = tool.approval_arguments

    def waits_for(ctx: StepContext) -> WaitSpec:
        arguments = {**(shown(ctx, values) if shown is not None else {}), **values}
        return WaitSpec(
            kind=WaitKind.APPROVAL, name=tool.name, arguments=arguments, rejected=rejected_result
        )

    return replace(step, waits_for=waits_for)
