"""The tool registry: declared effects, schemas, checked calls.

Every tool says whether it only reads (`read_only`: it runs as a `read` step) or changes the
world (`side_effect`: an `effect` step, claimed and committed before it runs, and given the
step's idempotency key). A tool that says neither, or both, is refused at registration.
A side effect also says how many times one run may make it (`max_calls`, default 1).
Arguments are validated before any call; a call that fails validation, names no known tool,
is over its `max_calls` or is refused by the tool is not executed, and the model gets the
reason as the tool's result, recorded like any other result so a replay hands it back unchanged.

Compensations are registered apart (`toolbox.compensation`) and never offered to the model:
only the engine runs one, to undo the completed call it is bound to when the run fails. A model
that could call `refund_fee` could record "refunded" before any charge, or refund a fee and
still take the new boarding pass.

    toolbox = Toolbox("refund_agent")

    @toolbox.tool("cancel_seat", side_effect=True, description="Cancel the booked seat.")
    def cancel_seat(ctx: ToolContext, booking_reference: str) -> dict: ...
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentflow._base.context import Decision, StepContext, UndoneCall
from agentflow._base.states import StepKind
from agentflow._core.replies import Replies
from agentflow._core.sensitive import Sensitive
from agentflow._core.serialization import to_json
from agentflow.agent.arguments import Arguments, ArgumentSpec, InvalidArguments
from agentflow.agent.fingerprint import LLM_CALL_NAME
from agentflow.exceptions import DefinitionError, ToolRefused

ToolFn = Callable[..., Any]
#: A tool's `approval_arguments`: (the call's step context, its arguments) -> what else to show.
ApprovalArguments = Callable[[StepContext, dict[str, Any]], dict[str, Any]]

#: What chat-completions servers accept as a function name.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True, kw_only=True)
class ToolRecord:
    """An earlier tool call of the same run, as the replay loop rebuilt it."""

    position: int
    name: str
    arguments: Any
    result: Any
    #: False when the call was refused (invalid, unknown, ToolRefused): nothing happened.
    ok: bool


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a tool function receives first. Side-effect tools pass `idempotency_key` to their
    partner; every attempt of the call (and every replay) has the same key."""

    run_id: str
    workflow: str
    #: The call's position in the run (its checkpoint's sequence number).
    position: int
    tool: str
    #: 1 on the first try; a retry of the same call under the same key counts up.
    attempt: int
    idempotency_key: str
    #: The run's input (e.g. `{"refund_id": ...}`): what the run is about, set in code.
    input: Any
    #: The run's earlier tool calls in order, so a tool can check what already happened (one
    #: charge per run) without trusting the model to say so.
    history: tuple[ToolRecord, ...] = ()
    #: A compensation's: the exact call it undoes, whatever branch it ran in (its output is
    #: the tool's result).
    undoes: UndoneCall | None = None
    #: A tool declared `requires_approval`: the approval this call runs under (None otherwise).
    decision: Decision | None = None

    def results_of(self, tool: str) -> list[Any]:
        """Results of the earlier calls of `tool` that ran (refused ones excluded), in order."""
        return [record.result for record in self.history if record.ok and record.name == tool]

    def output_of(self, tool: str, default: Any = None) -> Any:
        """The latest result of `tool` in this run: the same question a graph step asks with
        `StepContext.output_of`, answered from the trajectory."""
        results = self.results_of(tool)
        return results[-1] if results else default

    @property
    def outputs(self) -> dict[str, Any]:
        """The latest result of every tool that ran, by tool name."""
        return {record.name: record.result for record in self.history if record.ok}

    def step_context(self) -> StepContext:
        """This call as a graph step sees itself, so a domain's step code serves both engines.

        The key is this call's own (after a fork it names the branch, which a StepContext
        built from the run id and position alone would not).
        """
        outputs = self.outputs
        context = StepContext(
            run_id=self.run_id,
            workflow=self.workflow,
            seq=self.position,
            step=self.tool,
            attempt=self.attempt,
            input=self.input,
            load_outputs=lambda: outputs,
            undoes=self.undoes,
            decision=self.decision,
        )
        context.idempotency_key = self.idempotency_key
        return context


@dataclass(frozen=True, kw_only=True)
class ToolOutcome:
    """A tool call's recorded result: what the model reads, and whether the tool ran."""

    ok: bool
    result: Any

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "result": self.result}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ToolOutcome:
        return cls(ok=bool(data["ok"]), result=data["result"])


def refusal(error: str, message: str, **details: Any) -> ToolOutcome:
    """A result telling the model its call did not run, and why (a JSON object it can read)."""
    return ToolOutcome(ok=False, result={"error": error, "message": message, **details})


def refused_call(name: str, outcome: ToolOutcome) -> PreparedCall:
    """A call that runs nothing: recorded as a `read` (no claim) whose result is the refusal."""
    return PreparedCall(name=name, kind=StepKind.READ, refused=outcome)


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A tool as registered: what the model is shown of it and how a call of it runs."""

    name: str
    description: str
    side_effect: bool
    fn: ToolFn
    arguments: Arguments
    #: For a side effect whose outcome may be unknown after a crash: asks the partner what
    #: happened under this call's key; returns the result to adopt, or None if it did not.
    reconcile: ToolFn | None = None
    #: The tool that undoes this one when the run fails later (called with the arguments of
    #: this call that it takes, e.g. `charge_customer` -> `refund_fee(refund_id)`).
    compensate: str | None = None
    #: How long the partner keeps idempotency keys (docs/protocol.md, "The key window").
    key_window_seconds: float | None = None
    #: How many calls of this tool one run may make that ran (None: no limit, for reads);
    #: the next is refused, so one fee never buys a second boarding pass.
    max_calls: int | None = None
    #: True, or a predicate of the call's validated arguments: such a call waits for an
    #: operator's approval of exactly those arguments before it runs
    #: (docs/workflows.md, "Timers, signals and approvals").
    requires_approval: bool | Callable[[dict[str, Any]], bool] = False
    #: What else the operator reads to decide such a call, from the run (not from the model):
    #: given the step's context and the call's arguments; the decision binds to both.
    approval_arguments: ApprovalArguments | None = None
    #: Arguments only deciders and named readers may read in the admin (agentflow._core.sensitive).
    sensitive: Sensitive | None = None
    #: What a decision on a call of it may tell the customer (agentflow._core.replies).
    replies: Replies | None = None

    def needs_approval(self, values: dict[str, Any]) -> bool:
        """Whether this call (with these validated arguments) must be approved first."""
        if callable(self.requires_approval):
            return bool(self.requires_approval(values))
        return bool(self.requires_approval)

    @property
    def step_kind(self) -> StepKind:
        return StepKind.EFFECT if self.side_effect else StepKind.READ

    def openai_format(self) -> dict[str, Any]:
        """The tool as chat-completions' `tools` list shows it to the model."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.arguments.schema,
            },
        }


@dataclass(frozen=True)
class PreparedCall:
    """A model's tool call after lookup and validation, before anything runs.

    `kind` is the step kind the call runs as: the tool's, or `read` for a refused call, which
    executes nothing and so needs no claim before its result is recorded.
    """

    name: str
    kind: StepKind
    tool: Tool | None = None
    values: dict[str, Any] = field(default_factory=dict)
    refused: ToolOutcome | None = None

    def run(self, ctx: ToolContext) -> ToolOutcome:
        """Execute the tool (or return the refusal). Step errors propagate to the runtime."""
        if self.refused is not None:
            return self.refused
        assert self.tool is not None
        try:
            result = self.tool.fn(ctx, **self.values)
        except ToolRefused as exc:
            return refusal("refused", f"{self.name} did not run: {exc}")
        return ToolOutcome(ok=True, result=to_json(result, f"the result of tool {self.name!r}"))

    def reconcile(self, ctx: ToolContext) -> ToolOutcome | None:
        """After a crash left this call's outcome unknown: the partner's answer under the key
        (an outcome to adopt), or None when the tool has no reconcile or nothing happened."""
        if self.tool is None or self.tool.reconcile is None:
            return None
        found = self.tool.reconcile(ctx, **self.values)
        if found is None:
            return None
        return ToolOutcome(
            ok=True, result=to_json(found, f"the reconciled result of {self.name!r}")
        )


class Toolbox:
    """The tools of one agent workflow, by name. Names are persisted in checkpoints and shown
    to the model, so they are given explicitly, never taken from the function."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tools: dict[str, Tool] = {}
        self._compensations: dict[str, Tool] = {}

    def tool(
        self,
        name: str,
        *,
        description: str,
        read_only: bool = False,
        side_effect: bool = False,
        reconcile: ToolFn | None = None,
        compensate: str | None = None,
        key_window_seconds: float | None = None,
        max_calls: int | None = None,
        requires_approval: bool | Callable[[dict[str, Any]], bool] = False,
        approval_arguments: ApprovalArguments | None = None,
        sensitive: Sensitive | None = None,
        replies: Replies | None = None,
    ) -> Callable[[ToolFn], ToolFn]:
        """Register the decorated function as tool `name`, offered to the model.

        `max_calls`: how many times one run may make it (side effects default to 1).
        `requires_approval`: True, or a predicate of the validated arguments; such a call
        waits for `durable.approve` / `durable.reject` of exactly those arguments before it
        runs (with `ctx.decision`). Rejected (or timed out), it does not run and the model's
        result is `{"rejected": true, "reason": ..., "timed_out": ..., "reply": ...}`.
        `approval_arguments(ctx, arguments)`: what else the operator reads to decide, from the
        run rather than the model (what the customer wrote, which the model is never shown);
        the decision binds to it with the call. `sensitive`: parameters (or approval arguments)
        the admin shows only to deciders and the named readers (agentflow._core.sensitive).
        `replies`: what a decision may tell the customer (agentflow._core.replies).

        Raises:
            DefinitionError: not exactly one of `read_only` / `side_effect`, a bad or taken
                name, no description, a `max_calls` below 1, parameters without type hints, or
                a sensitive parameter the function does not take.
        """
        check_declared(self.name, name, read_only=read_only, side_effect=side_effect)
        self._check_name(name)
        if not description.strip():
            raise DefinitionError(f"{self.name}: tool {name!r} needs a description for the model")
        if read_only and (reconcile or compensate or key_window_seconds):
            raise DefinitionError(
                f"{self.name}: read-only tool {name!r} has nothing to reconcile or compensate"
            )
        if max_calls is not None and max_calls < 1:
            raise DefinitionError(f"{self.name}: tool {name!r} needs max_calls of at least 1")
        if not (isinstance(requires_approval, bool) or callable(requires_approval)):
            raise DefinitionError(
                f"{self.name}: tool {name!r}: requires_approval is True, False or a predicate "
                "of the call's arguments"
            )
        if (replies is not None or approval_arguments is not None) and not requires_approval:
            raise DefinitionError(
                f"{self.name}: tool {name!r} declares replies= or approval_arguments= for an "
                "approval it does not wait for (requires_approval)"
            )

        def decorator(fn: ToolFn) -> ToolFn:
            arguments = ArgumentSpec(name, fn)
            unknown = set(sensitive.arguments) - set(arguments.names) if sensitive else set()
            if unknown and approval_arguments is None:  # else they may be approval arguments
                raise DefinitionError(
                    f"{self.name}: tool {name!r} declares {sorted(unknown)} sensitive, which it "
                    "does not take"
                )
            self._tools[name] = Tool(
                name=name,
                description=" ".join(description.split()),
                side_effect=side_effect,
                fn=fn,
                arguments=arguments,
                reconcile=reconcile,
                compensate=compensate,
                key_window_seconds=key_window_seconds,
                max_calls=max_calls if max_calls is not None or read_only else 1,
                requires_approval=requires_approval,
                approval_arguments=approval_arguments,
                sensitive=sensitive,
                replies=replies,
            )
            return fn

        return decorator

    def compensation(
        self,
        name: str,
        *,
        reconcile: ToolFn | None = None,
        key_window_seconds: float | None = None,
    ) -> Callable[[ToolFn], ToolFn]:
        """Register the decorated function as compensation `name`: a side effect that the
        engine alone runs, to undo a completed call of a tool declaring `compensate=name`.
        It is never offered to the model, and a model that names it is told no such tool
        exists."""
        self._check_name(name)

        def decorator(fn: ToolFn) -> ToolFn:
            self._compensations[name] = Tool(
                name=name,
                description="",
                side_effect=True,
                fn=fn,
                arguments=ArgumentSpec(name, fn),
                reconcile=reconcile,
                key_window_seconds=key_window_seconds,
            )
            return fn

        return decorator

    def add(self, tool: Tool) -> None:
        """Offer a tool built elsewhere to the model: an MCP server's, as the host declared it
        (`agent.mcp_tools`).

        Raises:
            DefinitionError: a bad or taken name.
        """
        self._check_name(tool.name)
        self._tools[tool.name] = tool

    def _check_name(self, name: str) -> None:
        if not _TOOL_NAME.fullmatch(name or "") or name == LLM_CALL_NAME:
            raise DefinitionError(
                f"{self.name}: invalid tool name {name!r} (1-64 letters, digits, _ or -; "
                f"{LLM_CALL_NAME!r} names model turns)"
            )
        if name in self._tools or name in self._compensations:
            raise DefinitionError(f"{self.name}: tool {name!r} registered twice")

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    @property
    def tools(self) -> list[Tool]:
        """The model's tools and the compensations, in registration order."""
        return [*self._tools.values(), *self._compensations.values()]

    def openai_tools(self) -> list[dict[str, Any]]:
        """Every tool in registration order: part of each model turn's fingerprint."""
        return [tool.openai_format() for tool in self._tools.values()]

    def undo_tool(self, name: str) -> Tool | None:
        """The compensation registered as `name` (never one of the model's tools)."""
        return self._compensations.get(name)

    def validate(self) -> None:
        """Cross-references, once every tool is registered: a compensation must be registered
        with `compensation` and take only parameters the compensated tool's arguments cover."""
        for tool in self._tools.values():
            if tool.compensate is None:
                continue
            undo = self._compensations.get(tool.compensate)
            if undo is None:
                raise DefinitionError(
                    f"{self.name}: {tool.name!r} names {tool.compensate!r} as its compensation, "
                    "which is not a compensation of this toolbox (register it with "
                    "toolbox.compensation: the model never calls one)"
                )
            missing = set(undo.arguments.names) - set(tool.arguments.names)
            if missing:
                raise DefinitionError(
                    f"{self.name}: compensation {undo.name!r} needs {sorted(missing)}, which "
                    f"{tool.name!r} does not take"
                )

    def compensation_call(self, name: str, arguments: dict[str, Any]) -> tuple[str, dict] | None:
        """The call that undoes a completed call of `name`: its compensation tool, with the
        arguments of the original call that it takes. None when nothing undoes it."""
        tool = self._tools.get(name)
        if tool is None or tool.compensate is None:
            return None
        undo = self._compensations[tool.compensate]
        return undo.name, {key: arguments[key] for key in undo.arguments.names if key in arguments}

    def prepare(
        self, name: str, arguments: Any, *, history: Sequence[ToolRecord] = ()
    ) -> PreparedCall:
        """Look the tool up, validate the arguments and check its `max_calls` against the
        run's earlier calls (`history`); nothing runs yet."""
        tool = self._tools.get(name)
        if tool is None:
            return refused_call(
                name,
                refusal(
                    "unknown_tool",
                    f"There is no tool named {name!r}. Tools: {', '.join(self._tools)}.",
                ),
            )
        try:
            values = tool.arguments.validate(arguments)
        except InvalidArguments as exc:
            return refused_call(
                name,
                refusal(
                    "invalid_arguments",
                    f"{name} was not called: {exc}.",
                    problems=[problem.as_json() for problem in exc.problems],
                ),
            )
        made = [record.position for record in history if record.ok and record.name == name]
        if tool.max_calls is not None and len(made) >= tool.max_calls:
            return refused_call(
                name,
                refusal(
                    "limit_reached",
                    f"{name} was not called: a run may make it {_times(tool.max_calls)}, and "
                    f"this one has (the last was call {made[-1]}). Nothing was done.",
                ),
            )
        return PreparedCall(name=name, kind=tool.step_kind, tool=tool, values=values)

    def prepare_undo(self, name: str, arguments: Any) -> PreparedCall:
        """The compensation `name` with `arguments`, validated, for the engine to run."""
        undo = self._compensations[name]
        try:
            values = undo.arguments.validate(arguments)
        except InvalidArguments as exc:
            return refused_call(name, refusal("invalid_arguments", f"{name}: {exc}."))
        return PreparedCall(name=name, kind=StepKind.EFFECT, tool=undo, values=values)


def check_declared(owner: str, name: str, *, read_only: bool, side_effect: bool) -> None:
    """A tool declares exactly one of `read_only` / `side_effect`.

    Raises:
        DefinitionError: it declared neither, or both.
    """
    if read_only == side_effect:
        said = "both" if read_only else "neither"
        raise DefinitionError(
            f"{owner}: tool {name!r} must declare exactly one of read_only=True or "
            f"side_effect=True (it said {said}): whether a call may be repeated decides "
            "how it is checkpointed"
        )


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"
