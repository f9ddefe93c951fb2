"""Workflow definitions (docs/workflows.md, "A graph of steps"): named, versioned lists of named
steps, registered by name."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Protocol

from agentflow import _concurrency, _priority
from agentflow._base import identifiers
from agentflow._base.context import Decision, StepContext
from agentflow._base.retry import DEFAULT_RETRY, RetryPolicy
from agentflow._base.states import StepKind, WaitKind
from agentflow._core.replies import Replies
from agentflow._core.sensitive import Sensitive
from agentflow._privacy.personal import Personal
from agentflow.exceptions import DefinitionError, UnknownWorkflowError

StepFn = Callable[[StepContext], Any]

#: Returned by a branch function to end the workflow after this step.
END = "__end__"
#: Workflow and step names: the columns that hold them (a run's, a checkpoint's) take this many.
NAME_MAX_CHARS = 100
#: A planned compensation is named `refund_fee@b<branch>.<seq>`: room kept for the suffix.
UNDO_SUFFIX_CHARS = 12
#: A signal's name: the column that holds it (a wait's, a signal's) takes this many.
SIGNAL_MAX_CHARS = 200
#: A planned compensation names the call it undoes: `refund_fee@7` undoes the call at 7 of
#: the run's current branch, `refund_fee@b0.7` the call at 7 of branch 0, set aside by a fork.
_UNDO = re.compile(r"^(?P<undo>[^@]+)@(?:b(?P<branch>\d+)\.)?(?P<seq>\d+)$")


def undo_name(compensation: str, seq: int, branch: int | None = None) -> str:
    """The planned name of `compensation` undoing the call at `seq` (of a set-aside `branch`)."""
    return f"{compensation}@{seq}" if branch is None else f"{compensation}@b{branch}.{seq}"


def undo_target(name: str) -> tuple[str, int, int | None] | None:
    """`refund_fee@b0.7` -> ("refund_fee", 7, 0); None for a name that undoes no call."""
    found = _UNDO.match(name)
    if found is None:
        return None
    branch = int(found["branch"]) if found["branch"] is not None else None
    return found["undo"], int(found["seq"]), branch


def undoing(seq: int, branch: int | None) -> dict[str, Any]:
    """A compensation checkpoint's recorded arguments: the call it undoes
    (docs/protocol.md, "Operator actions")."""
    return {"undoes": {"seq": seq, "branch": branch}}


@dataclass(frozen=True, kw_only=True)
class WaitSpec:
    """What a step waits for before it runs (docs/workflows.md, "Timers, signals and approvals"), as
    the run reached it.

    The engine records it at the step's position the first time the run gets there (a timer's
    time, a timeout, the exact call to approve) and decides from that record ever after, so a
    replay, a restart or a redelivery finds the same wait, never a new one.
    """

    kind: WaitKind
    #: The signal's name; the call's (step's or tool's) name for an approval; the step's own
    #: name for a timer.
    name: str
    #: A timer: seconds from when the run first got there. A signal: its timeout (None waits
    #: until one comes). An approval: its timeout (None: `AGENTFLOW_APPROVAL_TIMEOUT`).
    seconds: float | None = None
    #: A timer's absolute time (instead of `seconds`).
    until: datetime | None = None
    #: An approval: the call's arguments, canonical JSON; with `name`, what the decision is
    #: bound to (its digest).
    arguments: Any = None
    #: An approval that was rejected or timed out: the step's recorded output, from the
    #: decision's JSON (`Decision.as_json()`); the step's function does not run.
    rejected: Callable[[dict[str, Any]], Any] | None = None
    #: A signal wait without a timeout: how often the run looks again while it waits (None:
    #: once a day). A wait whose signal its own step may send (a parent's wait for its
    #: children) looks often: a signal lost in a crash then costs a recheck's delay, never the run.
    recheck_seconds: float | None = None


#: Given the step's context, what it waits for (None: nothing, it runs at once).
WaitsFor = Callable[[StepContext], WaitSpec | None]


@dataclass(frozen=True, kw_only=True)
class StepDef:
    name: str
    kind: StepKind
    fn: StepFn
    retry: RetryPolicy = DEFAULT_RETRY
    #: Asks the partner whether the effect already happened (docs/protocol.md, "Unknown outcomes"):
    #: returns the output to adopt, None when it certainly did not happen, or raises OutcomeUnknown.
    reconcile: StepFn | None = None
    #: Name of the compensation step that undoes this one after a later permanent failure.
    compensate: str | None = None
    #: How long the partner keeps idempotency keys; older retries reconcile first
    #: (docs/protocol.md, "The key window").
    key_window_seconds: float | None = None
    #: Branch: given the step's output, the name of the next step (or END).
    next: Callable[[Any], str] | None = None
    #: Compensation-only steps are skipped by the forward path.
    compensation_only: bool = False
    #: Agent calls: what is recorded in the checkpoint's `arguments` (the call's
    #: fingerprint), and its idempotency key when it is not the default one (a forked branch's,
    #: or a superseded call's that is reused).
    arguments: Any = None
    key: str | None = None
    #: Agent calls: the fingerprint's digest, recorded in a column of its own for replays.
    digest: str = ""
    #: A timer, a signal or an approval the step waits for before it runs
    #: (docs/workflows.md, "Timers, signals and approvals").
    waits_for: WaitsFor | None = None
    #: Set by the engine once an approval was decided: what `ctx.decision` reads.
    decision: Decision | None = None
    #: Approval arguments only deciders and named readers may read (agentflow._core.sensitive), and
    #: what a decision may tell the customer (agentflow._core.replies).
    sensitive: Sensitive | None = None
    replies: Replies | None = None


def approval_wait(
    name: str,
    requires_approval: bool | Callable[[StepContext], bool],
    approval_arguments: Callable[[StepContext], dict[str, Any]] | None,
) -> WaitsFor | None:
    """A graph step's approval: the call is (step name, `approval_arguments(ctx)`)."""
    if not (isinstance(requires_approval, bool) or callable(requires_approval)):
        raise DefinitionError(
            f"step {name!r}: requires_approval is True, False or a predicate of the step's ctx"
        )
    if requires_approval is False:
        return None
    if approval_arguments is not None and not callable(approval_arguments):
        raise DefinitionError(f"step {name!r}: approval_arguments must be a function of ctx")

    def waits_for(ctx: StepContext) -> WaitSpec | None:
        if callable(requires_approval) and not requires_approval(ctx):
            return None
        arguments = approval_arguments(ctx) if approval_arguments is not None else {}
        return WaitSpec(kind=WaitKind.APPROVAL, name=name, arguments=arguments)

    return waits_for


def _timer(
    name: str, seconds: float | None, until: Callable[[StepContext], datetime] | None
) -> WaitsFor:
    if (seconds is None) == (until is None):
        raise DefinitionError(f"sleep {name!r}: give exactly one of seconds= or until=")
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds >= 0
    ):
        raise DefinitionError(f"sleep {name!r}: seconds must be 0 or more, not {seconds!r}")

    def waits_for(ctx: StepContext) -> WaitSpec:
        at = until(ctx) if until is not None else None
        if at is not None and (not isinstance(at, datetime) or at.tzinfo is None):
            raise DefinitionError(f"sleep {name!r}: until() must return an aware datetime")
        return WaitSpec(kind=WaitKind.TIMER, name=name, seconds=seconds, until=at)

    return waits_for


def _waited(ctx: StepContext) -> Any:
    raise AssertionError(f"{ctx.step}: a wait's output is the engine's record, not a function's")


@dataclass
class Workflow:
    """A named, versioned definition. Declare steps in order with the `step` decorator.

    Names are persisted, so they are given explicitly and never derived from function names.
    Bump `version` whenever steps change. A run in flight moves to the new code only when its
    recorded steps are all there, in the same order and kind (docs/deploys.md, "Builds",
    `agentflow._builds.upgrades`); otherwise it finishes on the build it started on.
    """

    name: str
    version: int = 1
    #: A compensation step that runs last whenever the run fails for good (e.g. tell the
    #: customer), after the compensations of the steps that had taken effect.
    on_failure: str | None = None
    steps: dict[str, StepDef] = field(default_factory=dict)
    #: "auto": a run moves to a newer build when that build can take it by rule
    #: (docs/deploys.md, "Builds"); "pinned": every run finishes on the build it started on.
    versioning: str = "auto"
    #: Keys of a run's input only deciders and the named readers may read in the admin
    #: (agentflow._core.sensitive), wherever their values appear in the run: a value that opens what
    #: they may not read (the key to a customer's own page) is as sensitive as what it opens.
    sensitive_input: Sensitive | None = None
    #: Which fields of what its runs store are personal, and whose (agentflow._privacy):
    #: sealed at rest under that person's key, erasable with it (docs/privacy.md).
    personal: Personal | None = None
    #: 0-9, higher taken first by every worker (docs/workflows.md, "Priorities"); a start may
    #: give its own. None: AGENTFLOW_DEFAULT_PRIORITY.
    priority: int | None = None
    #: The run's concurrency key, from its input (e.g. `lambda input: input["booking"]`): at
    #: most `concurrency_limit` runs of this workflow with one key run at once; the others wait
    #: in arrival order (docs/workflows.md, "Concurrency keys"). Stored hashed, never in clear.
    concurrency_key: Callable[[Any], str] | None = None
    concurrency_limit: int | None = None

    def __post_init__(self) -> None:
        refused = identifiers.problem("workflow name", self.name, max_chars=NAME_MAX_CHARS)
        if refused:
            raise DefinitionError(refused)
        _priority.declared(self.name, self.priority)
        self.concurrency_limit = _concurrency.declared(
            self.name, self.concurrency_key, self.concurrency_limit
        )
        if self.versioning not in VERSIONING:
            raise DefinitionError(
                f"workflow {self.name!r}: versioning is one of {VERSIONING}, "
                f"not {self.versioning!r}"
            )
        if self.sensitive_input is not None and not isinstance(self.sensitive_input, Sensitive):
            raise DefinitionError(
                f"workflow {self.name!r}: sensitive_input is a durable.Sensitive(...) naming "
                f"keys of the input, not {self.sensitive_input!r}"
            )
        if self.personal is not None and not isinstance(self.personal, Personal):
            raise DefinitionError(
                f"workflow {self.name!r}: personal is a durable.Personal(subject=..., "
                f"fields=[...]), not {self.personal!r}"
            )
        register(self)

    def step(
        self,
        name: str,
        *,
        kind: str = StepKind.READ,
        retry: RetryPolicy = DEFAULT_RETRY,
        reconcile: StepFn | None = None,
        compensate: str | None = None,
        key_window_seconds: float | None = None,
        next: Callable[[Any], str] | None = None,
        requires_approval: bool | Callable[[StepContext], bool] = False,
        approval_arguments: Callable[[StepContext], dict[str, Any]] | None = None,
        sensitive: Sensitive | None = None,
        replies: Replies | None = None,
    ) -> Callable[[StepFn], StepFn]:
        """Declare the decorated function as step `name`.

        `requires_approval` (True, or a predicate of the step's context): before the step runs
        the run waits for an operator's `durable.approve` / `durable.reject` of the call (this
        step, with `approval_arguments(ctx)`: what the operator sees, e.g. the amount). Approved,
        the function runs with `ctx.decision`; rejected or timed out, it does not run and the
        step's output is `{"approved": False, "actor", "reason", "timed_out", "reply"}`, which
        `next` can branch on. `sensitive`: approval arguments the admin shows only to deciders
        and the named readers; `replies`: what a decision may tell the customer.
        """
        if (sensitive is not None or replies is not None) and requires_approval is False:
            raise DefinitionError(
                f"{self.name}: step {name!r} declares sensitive= or replies= for an approval "
                "it does not wait for (requires_approval)"
            )
        return self._add(
            name,
            kind=StepKind(kind),
            retry=retry,
            reconcile=reconcile,
            compensate=compensate,
            key_window_seconds=key_window_seconds,
            next=next,
            compensation_only=False,
            waits_for=approval_wait(name, requires_approval, approval_arguments),
            sensitive=sensitive,
            replies=replies,
        )

    def sleep(
        self,
        name: str,
        *,
        seconds: float | None = None,
        until: Callable[[StepContext], datetime] | None = None,
        next: Callable[[Any], str] | None = None,
    ) -> None:
        """A step that waits: `seconds` from when the run gets there, or `until(ctx)` (an aware
        datetime). The run is WAITING meanwhile, holding no worker; its output is
        `{"woke_at": ISO time}`."""
        self._add(
            name,
            kind=StepKind.READ,
            next=next,
            compensation_only=False,
            waits_for=_timer(name, seconds, until),
        )(_waited)

    def wait_for(
        self,
        name: str,
        *,
        signal: str,
        timeout: float | None = None,
        next: Callable[[Any], str] | None = None,
    ) -> None:
        """A step that waits for `durable.signal(run_id, signal, payload, signal_id=...)`: its
        output is `{"payload": payload}`, or `{"timed_out": True}` once `timeout` seconds have
        passed without one (None: it waits until one comes). A signal sent before the run got
        here was kept: the step takes the oldest one kept and does not wait."""
        refused = identifiers.problem("signal name", signal, max_chars=SIGNAL_MAX_CHARS)
        if refused:
            raise DefinitionError(f"{self.name}: wait_for {name!r}: {refused}")
        if timeout is not None and not timeout > 0:
            raise DefinitionError(f"{self.name}: wait_for {name!r}: timeout must be above 0")
        spec = WaitSpec(kind=WaitKind.SIGNAL, name=signal, seconds=timeout)
        self._add(
            name,
            kind=StepKind.READ,
            next=next,
            compensation_only=False,
            waits_for=lambda ctx: spec,
        )(_waited)

    def compensation(
        self,
        name: str,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        reconcile: StepFn | None = None,
        key_window_seconds: float | None = None,
    ) -> Callable[[StepFn], StepFn]:
        """An effect step that only runs to undo earlier ones after a permanent failure."""
        return self._add(
            name,
            kind=StepKind.EFFECT,
            retry=retry,
            reconcile=reconcile,
            compensate=None,
            key_window_seconds=key_window_seconds,
            next=None,
            compensation_only=True,
        )

    def _add(self, name: str, **options: Any) -> Callable[[StepFn], StepFn]:
        longest = NAME_MAX_CHARS - (UNDO_SUFFIX_CHARS if options["compensation_only"] else 0)
        refused = identifiers.problem("step name", name, max_chars=longest)
        if refused or name == END or undo_target(name) is not None:
            reserved = f"{END!r} and names like 'undo@7' are the engine's"
            raise DefinitionError(f"{self.name}: invalid step name {name!r}: {refused or reserved}")
        if name in self.steps:
            raise DefinitionError(f"{self.name} v{self.version}: step {name!r} declared twice")

        def decorator(fn: StepFn) -> StepFn:
            self.steps[name] = StepDef(name=name, fn=fn, **options)
            return fn

        return decorator

    # --- what its calls declare about people -------------------------------------------------
    def sensitive_calls(self) -> dict[str, Sensitive]:
        """The calls (steps, or a code-first run's tools) declaring sensitive arguments."""
        return {n: s.sensitive for n, s in self.steps.items() if s.sensitive is not None}

    def declares_sensitive(self) -> bool:
        """Does anything of its runs need masking: a call's arguments or the input's keys?"""
        return self.sensitive_input is not None or bool(self.sensitive_calls())

    def replies_of(self, call: str) -> Replies | None:
        """What a decision on `call` may tell the customer (None: the call declares nothing)."""
        step = self.steps.get(call)
        return step.replies if step is not None else None

    # --- navigation ---------------------------------------------------------------------------
    def step_named(self, name: str) -> StepDef | None:
        """The definition of the step a run is at (None: not in this version); a planned
        compensation (`refund_fee@7`) is its step, recording the call it undoes."""
        found = self.steps.get(name)
        if found is not None:
            return found
        target = undo_target(name)
        if target is None:
            return None
        undo, seq, branch = target
        step = self.steps.get(undo)
        if step is None or not step.compensation_only:
            return None
        return replace(step, arguments=undoing(seq, branch))

    def compensation_for(
        self, name: str, seq: int, *, output: Any, branch: int | None = None
    ) -> str | None:
        """The planned compensation (`refund_fee@7`) that undoes the step `name` at `seq`
        (of a superseded `branch`, for forked agent runs), if any; `output` is what the
        step recorded (an agent run's refused call says it made nothing)."""
        if branch is not None:
            return None  # step graphs are never forked
        step = self.steps.get(name)
        if step is not None and step.compensate and step.kind == StepKind.EFFECT:
            return undo_name(step.compensate, seq)
        return None

    @property
    def forward_steps(self) -> list[str]:
        return [s.name for s in self.steps.values() if not s.compensation_only]

    def first_step(self) -> str:
        forward = self.forward_steps
        if not forward:
            raise DefinitionError(f"workflow {self.name!r} has no steps")
        return forward[0]

    def next_step(self, after: str, output: Any) -> str | None:
        """The step after `after`, or None when the workflow is done."""
        step = self.steps[after]
        if step.next is not None:
            chosen = step.next(output)
            if chosen == END:
                return None
            if chosen not in self.steps or self.steps[chosen].compensation_only:
                raise DefinitionError(f"{self.name}: branch of {after!r} chose {chosen!r}")
            return chosen
        forward = self.forward_steps
        index = forward.index(after) + 1
        return forward[index] if index < len(forward) else None

    def validate(self) -> None:
        """Check cross-references once every step is declared (called before first use)."""
        for step in self.steps.values():
            if step.compensate and not self._is_compensation(step.compensate):
                raise DefinitionError(
                    f"{self.name}: {step.name!r} names unknown compensation {step.compensate!r}"
                )
        if self.on_failure and not self._is_compensation(self.on_failure):
            raise DefinitionError(
                f"{self.name}: on_failure {self.on_failure!r} is not a compensation step"
            )

    def _is_compensation(self, name: str) -> bool:
        return name in self.steps and self.steps[name].compensation_only


#: The `current_step` of a code-defined run between calls: which call comes next is known only
#: once its function is replayed up to it.
NEXT_CALL = "(next call)"


class Difference(Protocol):
    """Where a dry replay of a code-defined run left its recorded history: the position, the
    two sides, and the whole difference as a person reads it."""

    @property
    def position(self) -> int: ...
    @property
    def recorded(self) -> str: ...
    @property
    def now(self) -> str: ...
    def text(self) -> str: ...


class CodeDefined(Workflow):
    """A workflow whose steps are the calls a function makes, found by replaying it (agent
    mode: `agentflow.agent.loop.CodeWorkflow`). All the core knows of one: its run is at
    `NEXT_CALL` between calls, where agent mode's own step path (handed to the runtime when
    the app starts) replays the function; and these methods."""

    def ask_partner(
        self, *, run_id: str, input: Any, call: Any, earlier: Callable[[], Sequence[Any]]
    ) -> Any | None:
        """Whether the recorded call `call` took effect, asked of its partner (a fork asks
        before it sets the call aside): the output to adopt, or None when it did not happen."""
        raise NotImplementedError

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
    ) -> Difference | None:
        """A dry replay of the run up to `seq` against its recorded calls: where it makes
        another call than the one recorded (None: it makes the same ones). Asks no partner,
        no model, writes nothing."""
        raise NotImplementedError

    def call_recorded(self, step: StepDef, output: Any) -> None:
        """A new call of its run was just asked and recorded (a model turn is counted)."""


#: A workflow's choices of `versioning`.
VERSIONING = ("auto", "pinned")

_definitions: dict[tuple[str, int], Workflow] = {}
_latest: dict[str, Workflow] = {}
#: Grows with every register and unregister: what a cached digest of the definitions keys on.
_generation = [0]


def register(workflow: Workflow) -> None:
    key = (workflow.name, workflow.version)
    if key in _definitions:
        raise DefinitionError(f"workflow {workflow.name!r} v{workflow.version} registered twice")
    _generation[0] += 1
    _definitions[key] = workflow
    current = _latest.get(workflow.name)
    if current is None or current.version < workflow.version:
        _latest[workflow.name] = workflow


def unregister(workflow: Workflow) -> None:
    """For tests that redefine a workflow to simulate a deploy."""
    _generation[0] += 1
    _definitions.pop((workflow.name, workflow.version), None)
    if _latest.get(workflow.name) is workflow:
        del _latest[workflow.name]
        others = [w for (n, _), w in _definitions.items() if n == workflow.name]
        if others:
            _latest[workflow.name] = max(others, key=lambda w: w.version)


def latest(name: str) -> Workflow:
    try:
        return _latest[name]
    except KeyError:
        raise UnknownWorkflowError(name, list(_latest)) from None


def lookup(name: str, version: int) -> Workflow | None:
    found = _definitions.get((name, version))
    if found is None:
        importer = _importer_of(name)
        if importer is not None:
            importer(name)  # a definition its module's import makes (a `@task`'s)
            found = _definitions.get((name, version))
    return found


#: By name prefix: given a workflow name this process has no definition of, import what
#: defines it (`agentflow._tasks_backend.resolver`: a `@task`'s module).
_importers: dict[str, Callable[[str], None]] = {}


def add_importer(prefix: str, importer: Callable[[str], None]) -> None:
    _importers[prefix] = importer


def _importer_of(name: str) -> Callable[[str], None] | None:
    return next((fn for prefix, fn in _importers.items() if name.startswith(prefix)), None)


def on_demand(name: str) -> bool:
    """Whether workflow `name` is defined on demand (by an importer): only processes that
    needed it know it, so no build's identity may depend on it (`agentflow._core.builds.digest`)."""
    return _importer_of(name) is not None


def validate_all() -> None:
    for workflow in _definitions.values():
        workflow.validate()


def names() -> list[str]:
    return sorted(_latest)


def definitions() -> list[Workflow]:
    """Every registered definition, by name and version."""
    return [_definitions[key] for key in sorted(_definitions)]


def generation() -> int:
    """Changes whenever the registered definitions do."""
    return _generation[0]
