"""Agent durable runs (docs/agent.md): a workflow written as a plain function of a context whose
calls — `ctx.llm`, `ctx.tool`, `ctx.step` — are durable.

Each Celery task replays the function from the top. A call with a checkpoint at its position
returns the recorded result (no model request, no tool call); the first call without one is
this task's single new step, which the runtime claims, runs and completes exactly like a graph
step (docs/protocol.md), then publishes the next message. A call whose fingerprint (position, kind,
name, canonical arguments) differs from the recorded one is a divergence: the run is parked with a
readable diff, never replayed against the wrong history.

    agent = durable.CodeWorkflow("refund_agent", version=1, toolbox=toolbox, model=planner)

    @agent.run
    def handle(ctx: durable.AgentContext) -> str:
        ctx.step("verify_ownership", verify)
        messages = opening_messages(ctx.input)
        while not (turn := ctx.llm(messages)).is_final:
            messages.append(turn.message)
            for call in turn.tool_calls:
                messages.append(tool_result_message(call.id, ctx.tool(call).result))
        return turn.text
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

from agentflow._base.canonical import canonical_json, digest
from agentflow._base.context import StepContext, UndoneCall, idempotency_key
from agentflow._base.retry import DEFAULT_RETRY, RetryPolicy
from agentflow._base.states import StepKind, StepStatus
from agentflow._conf import settings
from agentflow._core.registry import (
    NEXT_CALL,
    CodeDefined,
    StepDef,
    undo_name,
    undo_target,
    undoing,
)
from agentflow._core.replies import Replies
from agentflow._core.sensitive import Sensitive
from agentflow._core.serialization import to_json
from agentflow.agent import budget, pricing, telemetry, waiting
from agentflow.agent.clients import ModelClient, configured_client
from agentflow.agent.conversation import Message, ModelRequest, ModelResponse, ToolCall
from agentflow.agent.divergence import Change, Divergence, diverges
from agentflow.agent.fingerprint import (
    LLM_CALL_NAME,
    CallKind,
    Fingerprint,
    call_digest,
    llm_fingerprint,
    step_fingerprint,
    tool_fingerprint,
)
from agentflow.agent.limits import DEFAULT_TOOL_CALLS_PER_TURN, AgentLimits
from agentflow.agent.tools import (
    PreparedCall,
    Toolbox,
    ToolContext,
    ToolOutcome,
    ToolRecord,
    refusal,
    refused_call,
)
from agentflow.agent.turns import Turns, whole_request
from agentflow.exceptions import BudgetExceeded, DefinitionError, OutcomeUnknown, PermanentStepError

#: The call `durable.start_children` records in an agent run. Its output names the
#: compensation its function chose for the children (`{"children", "compensate"}`), which
#: undoes the call when the run fails or is cancelled, as a tool's compensation undoes a tool
#: call (docs/workflows.md, "Runs that start runs").
START_CHILDREN = "start_children"


@dataclass(eq=False)
class CodeWorkflow(CodeDefined):
    """A workflow whose steps are the durable calls its function makes (see the module)."""

    #: The tools the model may call (their compensations undo them when the run fails).
    toolbox: Toolbox | None = None
    #: The model: an offline client (a scripted planner); `AGENTFLOW_LLM_BASE_URL` replaces it
    #: with an OpenAI-compatible server.
    model: ModelClient | None = None
    retry: RetryPolicy = DEFAULT_RETRY
    #: What "done" means, in code: given the run's tool calls, None when the run did what it
    #: is for, else why not (in words). When the function returns and it is not done, the run
    #: fails and its compensations run: a model's final answer alone never completes a run.
    done: Callable[[Sequence[ToolRecord]], str | None] | None = None
    #: Tool calls one model turn may make (`AGENTFLOW_AGENT_MAX_TOOL_CALLS` caps the run).
    max_tool_calls_per_turn: int = DEFAULT_TOOL_CALLS_PER_TURN
    #: This workflow's caps on a run's model tokens and dollars, instead of the settings'
    #: (`AGENTFLOW_AGENT_MAX_TOKENS`, `AGENTFLOW_AGENT_MAX_COST_USD`); see `agent.budget`.
    max_tokens: int | None = None
    max_cost_usd: float | Decimal | None = None
    #: When the next model request could pass a cap: "park" the run "budget reached" for an
    #: operator (nothing undone), or "fail" it (its compensations run).
    on_budget: str = "park"
    #: Run a turn's consecutive read-only tool calls at once (`agent.steps`); False: one at
    #: a time, as every call was before.
    parallel_tool_calls: bool = True
    fn: Callable[[AgentContext], Any] | None = field(default=None, repr=False)

    def run(self, fn: Callable[[AgentContext], Any]) -> Callable[[AgentContext], Any]:
        """Decorator: the run's function."""
        self.fn = fn
        return fn

    def sensitive_calls(self) -> dict[str, Sensitive]:
        tools = self.toolbox.tools if self.toolbox is not None else ()
        return {t.name: t.sensitive for t in tools if t.sensitive is not None}

    def replies_of(self, call: str) -> Replies | None:
        if self.toolbox is not None and call in self.toolbox:
            return self.toolbox[call].replies
        return None

    def first_step(self) -> str:
        return NEXT_CALL

    def next_step(self, after: str, output: Any) -> str | None:
        return NEXT_CALL  # the function decides, on the next replay

    @property
    def forward_steps(self) -> list[str]:
        return []

    def validate(self) -> None:
        if self.fn is None:
            raise DefinitionError(f"{self.name}: no function (decorate one with .run)")
        if self.toolbox is not None:
            self.toolbox.validate()
        if self.on_budget not in budget.ON_REACHED:
            raise DefinitionError(f"{self.name}: on_budget is 'park' or 'fail'")
        if self.max_cost_usd is not None and not Decimal(str(self.max_cost_usd)) > 0:
            raise DefinitionError(f"{self.name}: max_cost_usd is a number of dollars above 0")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise DefinitionError(f"{self.name}: max_tokens is at least 1")
        super().validate()

    def step_named(self, name: str) -> StepDef | None:
        found = self.steps.get(name)
        if found is not None:
            return found
        target, toolbox = undo_target(name), self.toolbox
        if target is not None and toolbox is not None and toolbox.undo_tool(target[0]) is not None:
            return self._undo_step(name, *target)
        return super().step_named(name)  # a declared compensation: `cancel_kids@3`

    def compensation_for(
        self, name: str, seq: int, *, output: Any, branch: int | None = None
    ) -> str | None:
        """`refund_fee@7` for the completed `charge_customer` call at 7 (`refund_fee@b0.7` for
        one of superseded branch 0), if its tool has a compensation and the call ran: a
        refused call (unknown, invalid, over a limit, refused by the tool) made no effect, so
        nothing undoes it. A `start_children` call is undone by the compensation its record
        names (`cancel_kids@3`), if any."""
        if self.toolbox is None or name not in self.toolbox:
            chosen = output.get("compensate") if isinstance(output, dict) else None
            if name == START_CHILDREN and isinstance(chosen, str):
                return undo_name(chosen, seq, branch)
            return None
        if not (isinstance(output, dict) and output.get("ok") is True):
            return None
        undo = self.toolbox[name].compensate
        if not undo:
            return None
        return undo_name(undo, seq, branch)

    def outputs_view(self, outputs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
        """Recorded outputs by name as a step function reads them: a tool call's result rather
        than its recorded `{"ok", "result"}`, so domain step code serves both engines; the
        latest call of a tool that ran (a refused one after it does not hide it)."""
        view = {}
        for name, output in outputs:
            target = undo_target(name)  # a compensation reads as its tool: `refund_fee@7`
            tool = target[0] if target is not None else name
            toolbox = self.toolbox
            called = toolbox is not None and (
                tool in toolbox or toolbox.undo_tool(tool) is not None
            )
            if called and isinstance(output, dict):
                if output.get("ok"):
                    view[tool] = output.get("result")
            else:
                view[name] = output
        return view

    def ask_partner(
        self, *, run_id: str, input: Any, call: Any, earlier: Callable[[], Sequence[Any]]
    ) -> Any | None:
        """Whether the recorded tool call `call` took effect, asked of its partner through the
        tool's reconcile (a fork asks before it sets the call aside): the output to adopt, or
        None when it did not happen. `earlier`: reads the run's recorded calls before `call`
        (the caller's store read: the store imports definitions, not the other way), asked
        only once a reconcile can ask. Raises OutcomeUnknown when nothing can ask; whatever
        the reconcile raises when the partner cannot tell."""
        toolbox = self.toolbox
        if toolbox is None or call.name not in toolbox:
            raise OutcomeUnknown(f"{call.name} is not a tool of {self.name}")
        prepared = toolbox.prepare(call.name, _call_arguments(call))
        if prepared.tool is None or prepared.tool.reconcile is None:
            raise OutcomeUnknown(f"{call.name} has no way to ask its partner")
        ctx = StepContext(
            run_id=run_id,
            workflow=self.name,
            seq=call.seq,
            step=call.name,
            attempt=call.attempts,
            input=input,
            load_outputs=dict,
            key=call.idempotency_key,
        )
        history = _history(earlier(), toolbox)
        found = prepared.reconcile(_tool_context(ctx, call.name, history))
        return found.as_json() if found is not None else None

    def difference(
        self,
        *,
        run_id: str,
        input: Any,
        seq: int,
        branch: int,
        recorded: Mapping[int, Any],
        reusable: Callable[[], Sequence[Any]],
        calls: Callable[[], Sequence[Any]],
    ) -> Divergence | None:
        outcome = replay(
            self,
            run_id=run_id,
            input=input,
            seq=seq,
            branch=branch,
            recorded=recorded,
            reusable=reusable,
            calls=calls,
        )
        return outcome.divergence if isinstance(outcome, Divergent) else None

    def call_recorded(self, step: StepDef, output: Any) -> None:
        if step.kind == StepKind.LLM:
            telemetry.model_turn_recorded(workflow=self, output=output)

    def _undo_step(self, name: str, tool: str, seq: int, branch: int | None) -> StepDef:
        toolbox = self.toolbox
        assert toolbox is not None
        undo = toolbox.undo_tool(tool)
        assert undo is not None

        def prepared(ctx: StepContext) -> tuple[PreparedCall, ToolContext]:
            original = ctx.undoes  # the engine hands over the exact call, from its branch
            if original is None or original.status != StepStatus.COMPLETED:
                raise PermanentStepError(f"{name}: call {seq} to undo is not recorded")
            found = toolbox.compensation_call(original.name, _call_arguments(original))
            if found is None:
                raise PermanentStepError(f"{name}: {original.name} has no compensation")
            call = toolbox.prepare_undo(*found)
            history = _history(ctx.recorded_calls(), toolbox)  # the engine's read, handed in
            result = ToolOutcome.from_json(original.output).result
            return call, _tool_context(ctx, tool, history, undoes=replace(original, output=result))

        def run(ctx: StepContext) -> Any:
            call, tctx = prepared(ctx)
            outcome = call.run(tctx)
            if not outcome.ok:
                raise PermanentStepError(f"{name} did not run: {outcome.result}")
            return outcome.as_json()

        def reconcile(ctx: StepContext) -> Any:
            call, tctx = prepared(ctx)
            found = call.reconcile(tctx)
            return found.as_json() if found is not None else None

        return StepDef(
            name=name,
            kind=StepKind.EFFECT,
            fn=run,
            retry=self.retry,
            reconcile=reconcile if undo.reconcile is not None else None,
            key_window_seconds=undo.key_window_seconds,
            compensation_only=True,
            arguments=undoing(seq, branch),
        )


# --- the replay -----------------------------------------------------------------------------------
class Suspend(BaseException):
    """Unwinds the run's function at its first call without a checkpoint. A BaseException so
    the function's own `except Exception` cannot swallow it."""

    def __init__(self, step: StepDef, batch: tuple[StepDef, ...] = ()) -> None:
        super().__init__(step.name)
        self.step = step
        self.batch = batch or (step,)


class Diverged(BaseException):
    """The function made another call than the one recorded at a position."""

    def __init__(self, divergence: Divergence) -> None:
        super().__init__(divergence.summary)
        self.divergence = divergence


@dataclass(frozen=True, kw_only=True)
class Finished:
    output: Any
    #: The recorded tokens of the turns this last replay handed back, and their recorded cost
    #: in dollars (of the priced ones).
    tokens_saved: int = 0
    cost_saved: Decimal = Decimal(0)


@dataclass(frozen=True, kw_only=True)
class Failed:
    reason: str


@dataclass(frozen=True, kw_only=True)
class NextCall:
    step: StepDef
    #: The calls that run at once from `step`'s position on (`agent.steps`): `step` alone,
    #: or it and the read-only calls after it in the same turn, at consecutive positions.
    batch: tuple[StepDef, ...] = ()
    #: What the replay returned from checkpoints on the way: calls, model turns, and the
    #: recorded tokens of those turns (what asking the model again would have cost).
    replayed: int = 0
    replayed_turns: int = 0
    tokens_saved: int = 0
    cost_saved: Decimal = Decimal(0)


@dataclass(frozen=True, kw_only=True)
class Divergent:
    divergence: Divergence


@dataclass(frozen=True, kw_only=True)
class OverBudget:
    """The next model request could pass a cap and the workflow parks on it: why, with the
    figures (spent, lost, the request's worst case, the caps)."""

    reason: str
    figures: dict[str, Any]


Outcome = Finished | Failed | NextCall | Divergent | OverBudget


class AgentContext:
    """What an agent run's function sees: durable calls, and its input.

    Positions count every durable call from 1; a call's position is its checkpoint's sequence
    number. Calls before `seq` return what was recorded; the call at `seq` suspends the function
    and becomes this task's step.
    """

    def __init__(
        self,
        *,
        run_id: str,
        workflow: CodeWorkflow,
        input: Any,
        seq: int,
        branch: int,
        recorded: Mapping[int, Any],
        reusable: Callable[[], Sequence[Any]],
        calls: Callable[[], Sequence[Any]],
        exact: bool = False,
        attempts: Callable[[], Mapping[int, int]] | None = None,
        first_turns: Callable[[], Sequence[Any]] | None = None,
    ) -> None:
        self.run_id = run_id
        self.workflow = workflow
        self.input = input
        self._seq = seq
        self._branch = branch
        self._recorded = recorded
        self._reusable = reusable
        self._load_calls = calls
        self._whole: dict[int, Any] | None = None  # the calls whole, read once if ever
        self._position = 0
        self._turns_taken = 0
        self._tokens = 0
        self._cost = Decimal(0)  # the recorded cost of the priced turns replayed
        self._attempts = attempts  # model turns' attempts by position, read when asked
        self._ledger = budget.Ledger()
        # Recorded turns: (position, the input bound of each server it may have asked).
        self._asked: list[tuple[int, tuple[int, ...]]] = []
        # The latest recorded turn's reported prompt tokens, and who answered it (model, server).
        self._prompted: tuple[int, str, str] | None = None
        self._first_turns = first_turns  # other runs' first turns, read only near a cap
        self._limits = AgentLimits.from_settings(
            max_tool_calls_per_turn=workflow.max_tool_calls_per_turn
        )
        self._turn_calls = 0  # tool calls asked since the latest model turn
        self._turn_asked: tuple[ToolCall, ...] = ()  # the tool calls the latest turn asked
        self._calls_run = 0  # tool calls of the run that the caps let through
        toolbox = workflow.toolbox
        self._client: ModelClient | None = None
        self._tools = tuple(toolbox.openai_tools()) if toolbox is not None else ()
        self._turns = Turns(self._tools, exact=exact)
        # This branch's tool calls so far: (position, name, arguments, outcome), made into
        # records only when read (the next call's checks, the function, "done").
        self._called: list[tuple[int, str, Any, ToolOutcome]] = []
        self._earlier: list[ToolRecord] = []  # completed calls of superseded branches
        if branch and toolbox is not None:
            self._earlier = _history(reusable(), toolbox, positions=False)

    # --- the durable calls -----------------------------------------------------------------
    def llm(self, messages: Sequence[Message]) -> ModelResponse:
        """One model turn with the workflow's tools; recorded, and replayed, never re-asked."""
        client = self._model_client()
        sent = tuple(messages)
        position = self._next()
        digest = self._turns.observe(client.model, sent)
        self._turn_calls = 0

        def now() -> Fingerprint:
            return Fingerprint(
                position=position,
                kind=CallKind.LLM,
                name=LLM_CALL_NAME,
                arguments={"model": client.model},
                digest=digest,
            )

        def whole() -> Fingerprint:
            return llm_fingerprint(
                position, model=client.model, messages=list(sent), tools=list(self._tools)
            )

        recorded = self._replayed(position, LLM_CALL_NAME, digest, now, whole=whole)
        if recorded is not None:
            response = ModelResponse.from_json(recorded)
            self._turn_asked = response.tool_calls
            self._turns_taken += 1
            self._tokens += response.usage.total_tokens
            cost = pricing.recorded(recorded)
            self._cost += cost or 0
            self._ledger.spent(
                tokens=response.usage.total_tokens, cost_usd=cost, model=response.model
            )
            self._asked.append((position, self._input_bounds(client)))
            self._prompted = (response.usage.prompt_tokens, response.model, response.server)
            return response
        self._limits.check_turn(turns_taken=self._turns_taken, tokens_used=self._tokens)
        max_tokens = int(settings.AGENTFLOW_LLM_MAX_OUTPUT_TOKENS)
        self._check_budget(client, position, max_tokens)
        request = ModelRequest(
            model=client.model, messages=sent, tools=self._tools, max_tokens=max_tokens
        )

        def ask(ctx: StepContext) -> Any:
            response = client.complete(request)
            # Priced as it is recorded: a replay reads the figure of the day it was asked.
            cost = pricing.as_text(pricing.turn_cost(response))
            return {**response.as_json(), pricing.COST_KEY: cost}

        turn = self._turns.latest()
        raise Suspend(self._step(turn.fingerprint(position), StepKind.LLM, ask, extra={}))

    def tool(self, call: ToolCall) -> ToolOutcome:
        """One tool call the model asked for; checked first (a call over a cap or its tool's
        `max_calls`, or with invalid arguments, is refused: it runs nothing, its reason is the
        result); a side effect gets the call's idempotency key."""
        toolbox = self.workflow.toolbox
        if toolbox is None:
            raise DefinitionError(f"{self.workflow.name} has no toolbox")
        position = self._next()
        capped = self._count_call()
        arguments = call.arguments
        digest = call_digest(CallKind.TOOL, call.name, arguments)
        recorded = self._replayed(
            position, call.name, digest, lambda: tool_fingerprint(position, call.name, arguments)
        )
        if recorded is not None:
            outcome = ToolOutcome.from_json(recorded)
            self._called.append((position, call.name, arguments, outcome))
            return outcome
        self._limits.check_tokens(tokens_used=self._tokens)
        step, prepared = self._tool_step(toolbox, position, call, capped)
        raise Suspend(step, self._batch(toolbox, position, call, step, prepared))

    def _count_call(self) -> str | None:
        """Count a tool call against the caps: why it is refused, or None. Decided again on
        every replay from the same counts, so it needs no record of its own."""
        self._turn_calls += 1
        capped = self._limits.tool_call_refusal(in_turn=self._turn_calls, in_run=self._calls_run)
        if capped is None:
            self._calls_run += 1
        return capped

    def _tool_step(
        self, toolbox: Toolbox, position: int, call: ToolCall, capped: str | None
    ) -> tuple[StepDef, PreparedCall]:
        """The tool call at `position` as a step (checked: refused over a cap, unknown, with
        invalid arguments or past its `max_calls`), and the prepared call."""
        arguments = call.arguments
        history = self.history
        if capped is not None:
            prepared = refused_call(
                call.name, refusal("limit_reached", f"{call.name} was not called: {capped}.")
            )
        else:
            prepared = toolbox.prepare(call.name, arguments, history=history)

        def run(ctx: StepContext) -> Any:
            return prepared.run(_tool_context(ctx, call.name, history)).as_json()

        def reconcile(ctx: StepContext) -> Any:
            found = prepared.reconcile(_tool_context(ctx, call.name, history))
            return found.as_json() if found is not None else None

        tool = prepared.tool
        step = self._step(
            tool_fingerprint(position, call.name, arguments),
            prepared.kind,
            run,
            extra={"call_id": call.id},
            reconcile=reconcile if tool is not None and tool.reconcile else None,
            key_window_seconds=tool.key_window_seconds if tool is not None else None,
        )
        return waiting.with_approval(step, prepared), prepared

    def _batch(
        self,
        toolbox: Toolbox,
        position: int,
        call: ToolCall,
        step: StepDef,
        prepared: PreparedCall,
    ) -> tuple[StepDef, ...]:
        """`step`, and the calls after it in the latest turn that run alongside it: each only
        reads, so none needs another's result or its turn (`agent.steps`). A member checks
        its caps as the call would have been checked one at a time, in the model's order."""
        index = next((i for i, asked in enumerate(self._turn_asked) if asked.id == call.id), None)
        if not self.workflow.parallel_tool_calls or index is None or not _alongside(step, prepared):
            return (step,)
        batch = [step]
        for later in self._turn_asked[index + 1 :]:
            member, member_prepared = self._tool_step(
                toolbox, position + len(batch), later, self._count_call()
            )
            if not _alongside(member, member_prepared):
                break
            batch.append(member)
        return tuple(batch)

    def step(
        self,
        name: str,
        fn: Callable[[StepContext], Any],
        *,
        kind: str = StepKind.READ,
        arguments: Any = None,
        reconcile: Callable[[StepContext], Any] | None = None,
        key_window_seconds: float | None = None,
    ) -> Any:
        """Any other durable step of the run (`read`, `effect` or `db`), e.g. a check in code
        before the model is first asked; an effect may ask its partner what happened
        (`reconcile`, `key_window_seconds`: docs/protocol.md, "Unknown outcomes", "The key window")
        as a graph step does."""
        position = self._next()
        fingerprint = step_fingerprint(position, name, arguments)
        recorded = self._replayed(position, name, fingerprint.digest, lambda: fingerprint)
        if recorded is not None:
            return recorded
        raise Suspend(
            self._step(
                fingerprint,
                StepKind(kind),
                fn,
                extra={},
                reconcile=reconcile,
                key_window_seconds=key_window_seconds,
            )
        )

    def sleep(self, seconds: float) -> None:
        """Wait `seconds` (counted from when the run first gets here), holding no worker: the
        run is WAITING until then, and a replay after it returns at once."""
        self.wait_call(waiting.sleep_call(seconds=seconds))

    def sleep_until(self, when: datetime) -> None:
        """Wait until `when` (an aware datetime; a fixed one, e.g. from the input: it is part
        of the call's fingerprint)."""
        self.wait_call(waiting.sleep_call(until=when))

    def wait_for(self, name: str, *, timeout: float | None = None) -> waiting.Waited:
        """Wait for `durable.signal(run_id, name, payload, signal_id=...)`: its `.payload`, or
        `.timed_out` once `timeout` seconds (from when the run got here) passed without one. A
        signal sent before the run got here was kept: this takes the oldest one kept of `name`
        and returns at once."""
        return waiting.Waited.from_json(self.wait_call(waiting.signal_call(name, timeout)))

    def wait_call(self, call: waiting.WaitCall) -> Any:
        """The durable wait `call` at the next position (what `sleep`, `wait_for` and
        `durable.wait_for_children` do): its recorded outcome, or the run goes WAITING."""
        position = self._next()
        fingerprint = step_fingerprint(position, call.name, call.arguments)
        recorded = self._replayed(position, call.name, fingerprint.digest, lambda: fingerprint)
        if recorded is not None:
            return recorded
        step = self._step(fingerprint, StepKind.READ, _waited, extra={})
        if "reused" in step.arguments:  # the same wait, over in a branch a fork set aside
            raise Suspend(step)
        raise Suspend(replace(step, waits_for=call.waits_for or (lambda ctx: call.spec)))

    # --- what the function may read --------------------------------------------------------
    @property
    def branch(self) -> int:
        """0, or how many times an operator forked this run."""
        return self._branch

    @property
    def history(self) -> tuple[ToolRecord, ...]:
        """The tool calls made so far, this branch's and earlier branches' completed ones."""
        return (
            *self._earlier,
            *(
                ToolRecord(
                    position=position, name=name, arguments=arguments, result=o.result, ok=o.ok
                )
                for position, name, arguments, o in self._called
            ),
        )

    # --- replay ------------------------------------------------------------------------------
    def _check_budget(self, client: ModelClient, position: int, max_tokens: int) -> None:
        """Before the request at `position`: every earlier attempt of a turn that recorded no
        answer for it counts at its worst case (its claim was committed before it was sent),
        this request too, against the caps (`agent.budget`). Near a cap, a first turn's input
        is bounded again from another run's first turn that began the same way.

        Raises:
            BudgetExceeded: it could pass one.
        """
        attempts = self._attempts() if self._attempts is not None else {}
        model = client.model
        chain = tuple((server[0], server[1]) for server in _servers(client))

        def worst(inputs: Sequence[int]) -> budget.WorstCase:
            return budget.chain_worst_case(chain, inputs=inputs, max_tokens=max_tokens)

        for asked_at, inputs in self._asked:
            lost = attempts.get(asked_at, 1) - 1  # all but the one that was answered
            if lost > 0:
                self._ledger.lost(worst(inputs), requests=lost, model=model)
        caps = budget.Caps.for_workflow(self.workflow)

        def check(inputs: Sequence[int]) -> None:
            ledger = copy.deepcopy(self._ledger)
            now = worst(inputs)
            ledger.lost(now, requests=attempts.get(position, 0), model=model)
            ledger.check(caps, now, model=model)

        inputs = self._input_bounds(client)
        try:
            check(inputs)
        except BudgetExceeded:
            tighter = self._calibrated(client, inputs)
            if tighter == inputs:
                raise
            check(tighter)

    def _input_bounds(self, client: ModelClient) -> tuple[int, ...]:
        """The latest request's input bound at each server it may ask: its bytes, or, at the
        server and model that answered the turn before it when it starts with all of that
        turn's messages, the tokens that turn reported and the bytes added since."""
        by_bytes = budget.input_bound(self._turns.latest_size())
        added = self._turns.added_bytes()
        bounds = []
        for model, _provider, server in _servers(client):
            bound = by_bytes
            if added is not None and self._prompted is not None:
                tokens, answered_by, at = self._prompted
                if tokens > 0 and at == server and _same_model(answered_by, model):
                    bound = min(bound, budget.prefix_bound(tokens, added))
            bounds.append(bound)
        return tuple(bounds)

    def _calibrated(self, client: ModelClient, inputs: tuple[int, ...]) -> tuple[int, ...]:
        """`inputs`, tightened from the recorded first turns of other runs of the workflow
        (`first_turns`): one with the same tools whose messages the latest request starts with
        (at least its first, the system prompt) bounds that much of it by the tokens its
        server reported (`budget.prefix_bound`)."""
        if self._first_turns is None or self._asked:
            return inputs
        sent = [canonical_json(m) for m in self._turns.latest_messages()]
        bounds = list(inputs)
        for arguments, output in self._first_turns():
            request = arguments.get("arguments") if isinstance(arguments, dict) else None
            if not isinstance(request, dict) or not isinstance(output, dict):
                continue
            messages, tools = request.get("messages"), request.get("tools")
            if not isinstance(messages, list) or tools is None or request.get("keep", 0):
                continue
            if digest(tools) != self._turns.tools_digest:
                continue
            kept = 0
            for recorded, now in zip(messages, sent, strict=False):
                if canonical_json(recorded) != now:
                    break
                kept += 1
            added = self._turns.added_bytes(kept) if kept else None
            usage = output.get("usage") if isinstance(output.get("usage"), dict) else {}
            tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
            if added is None or not isinstance(tokens, int) or tokens <= 0:
                continue
            answered_by, at = str(output.get("model") or ""), str(output.get("server") or "")
            for index, (model, _provider, server) in enumerate(_servers(client)):
                if at == server and _same_model(answered_by, model):
                    bounds[index] = min(bounds[index], budget.prefix_bound(tokens, added))
        return tuple(bounds)

    def _model_client(self) -> ModelClient:
        """Chosen once per replay: a configured server's client is not built per turn."""
        if self._client is None:
            if self.workflow.model is None:
                raise DefinitionError(f"{self.workflow.name} has no model")
            self._client = configured_client(self.workflow.model)
        return self._client

    def _next(self) -> int:
        self._position += 1
        return self._position

    def _replayed(
        self,
        position: int,
        name: str,
        digest: str,
        now: Callable[[], Fingerprint],
        *,
        whole: Callable[[], Fingerprint] | None = None,
    ) -> Any | None:
        """The recorded output at `position` (a divergence if another call is recorded there),
        or None when this is the call to make now. The call is the recorded one when its name
        and digest are (the digest names its kind and arguments; the position, its row);
        only when they are not is its fingerprint built (`now`), and for a model turn its
        whole request (`whole`), for a divergence's diff."""
        recorded = self._recorded.get(position)
        if recorded is None:
            if position >= self._seq:
                return None
            raise Diverged(_missing(now()))
        recorded_name, status, recorded_digest, output = recorded
        same = recorded_digest == digest and recorded_name == name
        if position >= self._seq:
            if not same:  # a crashed attempt of this very call
                self._check(position, now(), whole, recorded_digest=recorded_digest)
            return None
        if status != StepStatus.COMPLETED:
            raise Diverged(_missing(now()))
        if not same:
            self._check(position, now(), whole, recorded_digest=recorded_digest)
        return output

    def _check(
        self,
        position: int,
        now: Fingerprint,
        whole: Callable[[], Fingerprint] | None,
        *,
        recorded_digest: str,
    ) -> None:
        """A divergence, unless the call was recorded before its digest had a column (none):
        then its stored fingerprint decides (a turn recorded whole, before deltas, names its
        chained digest by its messages)."""
        recorded = self._whole_call(position)
        if recorded is None:
            raise Diverged(_missing(now))
        found = Fingerprint.from_json(recorded.arguments)
        if not recorded_digest and found.matches(now):
            return
        if whole is not None and found.kind == CallKind.LLM:
            # Stored as deltas: the diff reads the two whole conversations.
            found, now = self._whole_recorded(position) or found, whole()
        divergence = diverges(found, now)
        assert divergence is not None  # the two whole requests differ as their digests do
        raise Diverged(divergence)

    def _whole_call(self, position: int) -> Any | None:
        """The call recorded at `position` whole, as stored (its arguments)."""
        if self._whole is None:
            self._whole = {call.seq: call for call in self._load_calls()}
        return self._whole.get(position)

    def _whole_recorded(self, position: int) -> Fingerprint | None:
        """The model turn recorded at `position`, rebuilt whole from the turns before it."""
        self._whole_call(position)
        assert self._whole is not None
        request = None
        for seq, call in self._whole.items():
            stored = call.arguments if isinstance(call.arguments, dict) else {}
            if seq > position or stored.get("kind") != CallKind.LLM:
                continue
            request = whole_request(stored.get("arguments"), request)
            if request is None:
                return None
        if request is None:
            return None
        return llm_fingerprint(position, **request)

    def _step(
        self,
        fingerprint: Fingerprint,
        kind: StepKind,
        fn: Callable[[StepContext], Any],
        *,
        extra: dict[str, Any],
        reconcile: Callable[[StepContext], Any] | None = None,
        key_window_seconds: float | None = None,
    ) -> StepDef:
        """This call as the run's next step; an identical call made in a superseded branch is
        adopted with its result and key instead of being made again."""
        arguments = {**fingerprint.as_json(), **extra}
        reused = self._reuse(fingerprint) if self._branch else None
        if reused is not None:
            output = reused.output
            return StepDef(
                name=fingerprint.name,
                kind=StepKind.READ,
                fn=lambda ctx: output,
                arguments={**arguments, "reused": {"key": reused.idempotency_key}},
                key=reused.idempotency_key,
                digest=fingerprint.digest,
            )
        return StepDef(
            name=fingerprint.name,
            kind=kind,
            fn=fn,
            retry=self.workflow.retry,
            reconcile=reconcile,
            key_window_seconds=key_window_seconds,
            arguments=arguments,
            key=idempotency_key(self.run_id, fingerprint.position, self._branch),
            digest=fingerprint.digest,
        )

    def _reuse(self, now: Fingerprint) -> Any | None:
        for call in self._reusable():
            if waiting.timed_out(call.kind, call.output):
                continue  # nobody decided it: the new branch waits for a decision
            recorded = Fingerprint.from_json(call.arguments)
            if (recorded.kind, recorded.name, recorded.digest) == (now.kind, now.name, now.digest):
                return call
        return None


def replay(
    workflow: CodeWorkflow,
    *,
    run_id: str,
    input: Any,
    seq: int,
    branch: int,
    recorded: Mapping[int, Any],
    reusable: Callable[[], Sequence[Any]],
    calls: Callable[[], Sequence[Any]],
    attempts: Callable[[], Mapping[int, int]] | None = None,
    first_turns: Callable[[], Sequence[Any]] | None = None,
) -> Outcome:
    """Run the function from the top against its recorded calls; what this task must do.
    `recorded`: the branch's calls by position, as `store.replay_load` reads them (digests,
    not arguments); `calls()`: the same calls whole, as stored, read only when a digest
    differs (a divergence's diff, a call recorded before digests had a column);
    `attempts()`: the model turns' attempt counts by position, read only before a request;
    `first_turns()`: other runs' recorded first model turns (arguments, output), read only
    when a first request is near a cap (`AgentContext._calibrated`).

    Again, comparing every turn's messages by value, if the function changed a message in
    place after a model turn was sent it (see `Turns`)."""

    def attempt(exact: bool) -> tuple[Outcome, AgentContext]:
        ctx = AgentContext(
            run_id=run_id,
            workflow=workflow,
            input=input,
            seq=seq,
            branch=branch,
            recorded=recorded,
            reusable=reusable,
            calls=calls,
            exact=exact,
            attempts=attempts,
            first_turns=first_turns,
        )
        return _run(workflow, seq, ctx), ctx

    outcome, ctx = attempt(exact=False)
    if ctx._turns.changed_in_place():
        outcome, _ = attempt(exact=True)
    return outcome


def _run(workflow: CodeWorkflow, seq: int, ctx: AgentContext) -> Outcome:
    assert workflow.fn is not None
    try:
        result = workflow.fn(ctx)
    except Suspend as suspended:
        return NextCall(
            step=suspended.step,
            batch=suspended.batch,
            replayed=ctx._position - 1,
            replayed_turns=ctx._turns_taken,
            tokens_saved=ctx._tokens,
            cost_saved=ctx._cost,
        )
    except Diverged as diverged:
        return Divergent(divergence=diverged.divergence)
    except BudgetExceeded as exc:
        if exc.figures and workflow.on_budget == "park":  # a request not sent: nothing undone
            return OverBudget(reason=str(exc), figures=exc.figures)
        return Failed(reason=str(exc))
    except PermanentStepError as exc:
        return Failed(reason=str(exc))
    if seq in ctx._recorded:  # it returned without making the call recorded (in flight) at `seq`
        pending = ctx._whole_call(seq)
        if pending is not None:
            return Divergent(divergence=_extra(Fingerprint.from_json(pending.arguments)))
    unfinished = workflow.done(ctx.history) if workflow.done is not None else None
    if unfinished:
        return Failed(reason=unfinished)
    output = to_json(result, f"the result of {workflow.name}")
    return Finished(output=output, tokens_saved=ctx._tokens, cost_saved=ctx._cost)


def _servers(client: ModelClient) -> tuple[tuple[str, str, str], ...]:
    """Each (model, provider, base URL) one attempt of `client` may ask: a fallback chain's
    (`agent.fallbacks`), whose worst cases add up, or the client's own."""
    clients = getattr(client, "clients", None) or (client,)
    return tuple(
        (
            str(one.model),
            str(getattr(one, "provider", "") or ""),
            str(getattr(one, "base_url", "") or ""),
        )
        for one in clients
    )


def _same_model(answered_by: str, asked_for: str) -> bool:
    """Did the model that answered (as its server names it: `gpt-4o-mini-2024-07-18`) answer
    for `asked_for` (`gpt-4o-mini`)? Then the tokens it reported are this model's."""
    return bool(asked_for) and (answered_by == asked_for or answered_by.startswith(asked_for + "-"))


def _alongside(step: StepDef, prepared: PreparedCall) -> bool:
    """May this call run at once with others? Only a read (a read-only tool, or a refused
    call, which runs nothing) that waits for no approval, and not a call adopted from a
    superseded branch: once a member adopts one its key is taken, so a sibling's replay would
    see that call as a new one (an effect, no longer refused over its `max_calls`) and find
    other calls at the batch's positions. Adopted calls act no more: one at a time is free."""
    adopted = isinstance(step.arguments, dict) and "reused" in step.arguments
    return (
        prepared.kind == StepKind.READ
        and step.kind == StepKind.READ
        and step.waits_for is None
        and not adopted
    )


def _waited(ctx: StepContext) -> Any:
    raise AssertionError(f"{ctx.step}: a wait's outcome is the engine's record")


def _missing(now: Fingerprint) -> Divergence:
    nothing = "no completed call"
    return Divergence(
        position=now.position,
        recorded=nothing,
        now=now.describe(),
        changes=(Change(path="call", recorded=nothing, now=now.describe()),),
    )


def _extra(recorded: Fingerprint) -> Divergence:
    ended = "no call (the function returned)"
    return Divergence(
        position=recorded.position,
        recorded=recorded.describe(),
        now=ended,
        changes=(Change(path="call", recorded=recorded.describe(), now=ended),),
    )


def _call_arguments(call: Any) -> dict[str, Any]:
    arguments = (call.arguments or {}).get("arguments")
    return arguments if isinstance(arguments, dict) else {}


def _history(calls: Sequence[Any], toolbox: Toolbox, *, positions: bool = True) -> list[ToolRecord]:
    """Tool records rebuilt from checkpoints (completed tool calls only)."""
    records = []
    for call in calls:
        if call.name not in toolbox or call.status != StepStatus.COMPLETED:
            continue
        if not isinstance(call.output, dict):
            continue
        outcome = ToolOutcome.from_json(call.output)
        records.append(
            ToolRecord(
                position=call.seq if positions else 0,
                name=call.name,
                arguments=_call_arguments(call),
                result=outcome.result,
                ok=outcome.ok,
            )
        )
    return records


def _tool_context(
    ctx: StepContext,
    tool: str,
    history: Sequence[ToolRecord],
    *,
    undoes: UndoneCall | None = None,
) -> ToolContext:
    return ToolContext(
        run_id=ctx.run_id,
        workflow=ctx.workflow,
        position=ctx.seq,
        tool=tool,
        attempt=ctx.attempt,
        idempotency_key=ctx.idempotency_key,
        input=ctx.input,
        history=tuple(history),
        undoes=undoes,
        decision=ctx.decision,
    )
