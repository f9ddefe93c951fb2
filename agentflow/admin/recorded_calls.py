"""One recorded durable call of an agent run, read for people: a model turn (what the code
added to the conversation, the answer, the tools it asked for, its tokens), a tool call (its
arguments and result, ran or refused), a step in code, or a compensation.

Rows are read defensively: a checkpoint whose arguments or output are not in the shape the
engine writes (hand-edited, written by another version, null, 5 MB) shows what it can with a
note saying what could not be read, never a traceback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, Protocol

from agentflow._base.states import StepKind, StepStatus
from agentflow._core.registry import undo_target
from agentflow.admin.display import Shown, compact
from agentflow.agent import pricing

#: Words (a prompt, an answer, an error) are cut past this many characters.
MAX_WORDS_CHARS = 4000
#: A compensation step of an agent run undoes the call at a position: `refund_fee@7`.


class Row(Protocol):
    """A checkpoint or a superseded step: the fields both have."""

    seq: int
    name: str
    kind: str
    status: str
    attempts: int
    idempotency_key: str
    arguments: Any
    output: Any
    error: str
    finished_at: datetime | None


class Part(StrEnum):
    TURN = "turn"  # a model turn (ctx.llm)
    TOOL = "tool"  # a tool call the model asked for (ctx.tool)
    STEP = "step"  # a step in code (ctx.step)
    UNDO = "undo"  # a compensation of a recorded call
    OTHER = "other"  # any other step: the workflow's on-failure step


#: The parts a replay of the run's function hands back (compensations are not replayed).
REPLAYED_PARTS = (Part.TURN, Part.TOOL, Part.STEP)


@dataclass(frozen=True, kw_only=True)
class Said:
    """A message the run's code put in the conversation (system or user)."""

    role: str
    text: str


@dataclass(frozen=True, kw_only=True)
class Asked:
    """A tool call a model turn asked for, in the order it listed them."""

    name: str
    arguments: Shown
    call_id: str


@dataclass(frozen=True, kw_only=True)
class Tokens:
    prompt: int
    completion: int
    total: int


@dataclass(kw_only=True)
class Call:
    """One durable call at its position, as the conversation shows it."""

    position: int
    part: Part
    name: str
    kind: str
    status: str
    attempts: int
    key: str
    error: str = ""
    finished_at: datetime | None = None
    # model turns
    turn: int | None = None
    #: System and user messages the code added since the previous turn (all, on the first).
    added: list[Said] = field(default_factory=list)
    text: str = ""
    asked: list[Asked] = field(default_factory=list)
    finish_reason: str = ""
    model: str = ""
    tokens: Tokens | None = None
    #: Its recorded cost in dollars; None: unknown (no price for its model, or not recorded).
    cost: Decimal | None = None
    # tools, steps, compensations
    arguments: Shown | None = None
    result: Shown | None = None
    #: A tool's outcome: True ran, False refused (nothing happened), None not known.
    ok: bool | None = None
    effect: bool = False
    #: This call adopted the result and key of an identical call of a superseded branch.
    reused_key: str = ""
    #: (superseded calls) the position where a later branch adopted this call's result.
    reused_at: int | None = None
    undoes: int | None = None
    #: What could not be read in the expected shape.
    notes: list[str] = field(default_factory=list)
    #: How many later tasks handed this call back instead of making it (set by `replays`).
    replayed: int = 0
    #: Tokens those replays did not spend (model turns; set by `replays`).
    saved: int = 0

    @property
    def final(self) -> bool:
        """A model answer without tool calls: the agent's last word."""
        return self.part == Part.TURN and self.status == StepStatus.COMPLETED and not self.asked

    @property
    def made_effect(self) -> bool:
        """A side effect that completed: it happened at the partner."""
        return self.effect and self.status == StepStatus.COMPLETED


def read_call(row: Row) -> Call:
    """The call a checkpoint (or superseded step) records."""
    recorded = fingerprint(row)
    call = Call(
        position=row.seq,
        part=_part(row, recorded),
        name=str(row.name),
        kind=str(row.kind),
        status=str(row.status),
        attempts=row.attempts if isinstance(row.attempts, int) else 0,
        key=str(row.idempotency_key),
        error=words(row.error),
        finished_at=row.finished_at,
        effect=row.kind == StepKind.EFFECT,
    )
    if recorded is None:
        if call.part == Part.TURN:
            call.notes.append("its request is not recorded in the expected shape")
        if row.arguments is not None and call.part != Part.UNDO:  # an undo records its target
            call.arguments = compact(row.arguments)
    else:
        reused = recorded.get("reused")
        if isinstance(reused, dict) and isinstance(reused.get("key"), str):
            call.reused_key = reused["key"]
        if call.part != Part.TURN and recorded.get("arguments") is not None:
            call.arguments = compact(recorded["arguments"])
    if call.part == Part.TURN:
        _read_turn(call, row)
    elif call.part in (Part.TOOL, Part.UNDO):
        _read_outcome(call, row.output, row.status)
        undo = undo_target(call.name) if call.part == Part.UNDO else None
        call.undoes = undo[1] if undo else None
    elif row.output is not None:
        call.result = compact(row.output)
    return call


def fingerprint(row: Row) -> dict[str, Any] | None:
    """The call's recorded fingerprint (`Fingerprint.as_json()`), if it has that shape."""
    arguments = row.arguments
    if isinstance(arguments, dict) and arguments.get("kind") in ("llm", "tool", "step"):
        return arguments
    return None


def sent_messages(row: Row) -> list[Any] | None:
    """The messages a model turn's checkpoint stores (those it added to the turn before's, or
    all of them for a turn recorded whole), or None if unreadable."""
    recorded = fingerprint(row)
    request = recorded.get("arguments") if recorded else None
    found = request.get("messages") if isinstance(request, dict) else None
    return found if isinstance(found, list) else None


def said(message: dict[str, Any]) -> Said:
    content = message.get("content")
    text = content if isinstance(content, str) else compact(content).text
    return Said(role=text_of(message.get("role")) or "?", text=words(text))


def words(value: Any) -> str:
    text = "" if value is None else str(value)
    if len(text) <= MAX_WORDS_CHARS:
        return text
    return f"{text[:MAX_WORDS_CHARS]}… ({len(text):,} characters in all)"


def text_of(value: Any) -> str:
    return value if isinstance(value, str) else ""


def int_of(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --- pieces ---------------------------------------------------------------------------------------
def _part(row: Row, recorded: dict[str, Any] | None) -> Part:
    kind = recorded.get("kind") if recorded else None
    if kind == "llm" or (kind is None and row.kind == StepKind.LLM):
        return Part.TURN
    if kind == "tool":
        return Part.TOOL
    if kind == "step":
        return Part.STEP
    if undo_target(str(row.name)):
        return Part.UNDO
    return Part.OTHER


def _read_turn(call: Call, row: Row) -> None:
    if fingerprint(row) is not None and sent_messages(row) is None:
        call.notes.append("its request holds no messages in the expected shape")
    if row.status != StepStatus.COMPLETED:
        return  # no answer yet (in flight) or none (failed: the error says why)
    output = row.output
    message = output.get("message") if isinstance(output, dict) else None
    if not isinstance(output, dict) or not isinstance(message, dict):
        call.notes.append("its answer is not recorded in the expected shape")
        call.result = compact(output)
        return
    content = message.get("content")
    if content is not None:
        call.text = words(content if isinstance(content, str) else compact(content).text)
    parts = message.get("tool_calls") or []
    if not isinstance(parts, list):
        call.notes.append("its tool calls are not recorded in the expected shape")
        parts = []
    for part in parts:
        asked = _asked(part)
        if asked is None:
            call.notes.append("a tool call it asked for is not in the expected shape")
            asked = Asked(name="?", arguments=compact(part), call_id="")
        call.asked.append(asked)
    call.finish_reason = text_of(output.get("finish_reason"))
    call.model = text_of(output.get("model"))
    call.cost = pricing.recorded(output)
    call.tokens = _tokens(output.get("usage"))
    if call.tokens is None:
        call.notes.append("its token usage is not recorded in the expected shape")


def _asked(part: Any) -> Asked | None:
    function = part.get("function") if isinstance(part, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return None
    text = function.get("arguments")
    try:
        arguments = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        arguments = text  # the model sent text that is not JSON: shown as it came
    return Asked(
        name=function["name"], arguments=compact(arguments), call_id=text_of(part.get("id"))
    )


def _read_outcome(call: Call, output: Any, status: str) -> None:
    """A tool's recorded `{"ok", "result"}`: it ran, or it was refused (nothing happened)."""
    if output is None:
        if status == StepStatus.COMPLETED:
            call.notes.append("its result is not recorded")
        return
    if isinstance(output, dict) and isinstance(output.get("ok"), bool) and "result" in output:
        call.ok = output["ok"]
        call.result = compact(output["result"])
        return
    call.notes.append("its result is not recorded in the expected shape")
    call.result = compact(output)


def _tokens(usage: Any) -> Tokens | None:
    if not isinstance(usage, dict):
        return None
    numbers = {}
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = usage.get(name) or 0
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            return None
        numbers[name] = int(value)
    prompt, completion = numbers["prompt_tokens"], numbers["completion_tokens"]
    return Tokens(
        prompt=prompt, completion=completion, total=numbers["total_tokens"] or prompt + completion
    )
