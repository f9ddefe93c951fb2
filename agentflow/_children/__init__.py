"""Runs that start runs, and many runs at once (docs/workflows.md, "Runs that start runs" and
"Many runs at once"): what `durable.start_many`, `durable.start_children`,
`durable.wait_for_children` and `durable.cancel_children` do.

A child is an ordinary run with a link to its parent and the position of the step that started
it. Its business key is derived from that position (`<parent>:<seq>:<key or index>`), so the
step run again after a crash, a redelivery or a takeover finds the children it started and
starts none twice. The parent's wait is a signal wait on its own run: each child that ends
rings the parent (`store.parents`), the wait counts the children again, and once its rule is
met the parent keeps the report as a signal to itself, which the wait takes in the commit that
ends it. Counting again on every look, and looking again every RECHECK_SECONDS on its own,
is what makes a lost doorbell harmless. What happens to the children when the parent fails or
is cancelled is the parent's compensation to say: `cancel_children` cancels those still
running (each undoes what it did), and a start without it leaves them. A graph step declares
it (`compensate=`); an agent run's `start_children` call names it (`compensate=`, required:
the function says cancel or leave), its record keeps the choice, and the run's compensation
plan undoes that call as it undoes a tool call (`CodeWorkflow.compensation_for`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from types import EllipsisType
from typing import Any

from django.db import transaction

from agentflow import _concurrency, _priority
from agentflow import _store as store
from agentflow._base.context import StepContext
from agentflow._base.states import TERMINAL_RUN_STATUSES, StepKind, WaitKind
from agentflow._conf import settings
from agentflow._core import registry
from agentflow._core.registry import DefinitionError, WaitSpec, Workflow, undo_target
from agentflow._core.serialization import NotJSONError, storable_text, to_json
from agentflow._observe import telemetry
from agentflow._privacy import keystore
from agentflow._store.children import ChildEnd, NewRun
from agentflow.agent.loop import START_CHILDREN, AgentContext, CodeWorkflow
from agentflow.agent.waiting import WaitCall
from agentflow.exceptions import InvalidInputError, PermanentStepError
from agentflow.models import WorkflowRun

#: What a parent's wait asks for. "all": every child ended; "first": one did.
WAITS = ("all", "first")
#: How often a waiting parent counts its children again by itself: the doorbell of a child
#: whose worker died between its last commit and the ring is repaired within this.
RECHECK_SECONDS = 30.0
#: The signal a parent's wait takes its children's report under (`children:<seq>`): no one
#: else may send one (`durable.signal` refuses the prefix).
SIGNAL_PREFIX = "children:"
#: The checkpoint names of an agent workflow's calls that start children and wait for them.
START_CALL = START_CHILDREN
WAIT_CALL = "wait_for_children"
#: The longest business key a run takes (the column's size).
KEY_MAX_CHARS = 200


def start_many(
    runs: Iterable[tuple[str, Any, str | None]],
    *,
    parent: tuple[str, int] | None = None,
    priority: int | None = None,
) -> list[str]:
    """Start a run for each (workflow, input, business key) and return their ids, in order:
    a few statements per thousand runs, in the caller's transaction (or one of its own), each
    first step published once it commits. Idempotent on business keys, as `start` is. Each
    run's priority and concurrency key are what `start` would give it (`priority`, else its
    workflow's, else AGENTFLOW_DEFAULT_PRIORITY): a run over its key's cap is created WAITING.
    A run of a workflow declaring personal fields is sealed under its subject's key and bound
    to it, as `start` does one (the distinct subjects' keys read or made together)."""
    chosen = _priority.given(priority)
    items = [_new_run(entry, chosen) for entry in runs]
    if not items:
        return []
    subjects = _subjects(items)
    with transaction.atomic():
        if subjects:
            keys = store.subject_keys_for_many(s for s in subjects if s is not None)
            items = [
                item if subject is None else dataclasses.replace(item, subject_key=keys[subject])
                for item, subject in zip(items, subjects, strict=True)
            ]
        ids, created = store.runs_create_many(items, parent=parent)
    names = {run_id: item.workflow.name for run_id, item in zip(ids, items, strict=True)}
    for run_id in created:
        telemetry.run_started(run_id, names[run_id], keep_trace=store.trace_parent_record)
    return ids


def _subjects(items: Sequence[NewRun]) -> list[str | None]:
    """Each run's subject (None: its workflow declares nothing personal); [] when none has one
    or personal fields are not sealed (no master key)."""
    if not any(item.workflow.personal is not None for item in items) or not keystore.enabled():
        return []
    found: list[str | None] = []
    for item in items:
        personal = item.workflow.personal
        try:
            found.append(None if personal is None else personal.subject_of(item.input))
        except DefinitionError as exc:
            raise InvalidInputError(str(exc)) from None
    return found


def _new_run(entry: tuple[str, Any, str | None], priority: int | None) -> NewRun:
    try:
        workflow, given, business_key = entry
    except (TypeError, ValueError):
        raise InvalidInputError(
            f"each run to start is (workflow, input, business_key), not {entry!r}"
        ) from None
    definition = registry.latest(workflow)
    definition.validate()
    if business_key is not None and not (
        isinstance(business_key, str)
        and 0 < len(business_key) <= KEY_MAX_CHARS
        and storable_text(business_key)
    ):
        raise InvalidInputError("a business key is text of 1-200 characters, without NUL")
    try:
        payload = to_json({} if given is None else given, "workflow input")
    except NotJSONError as exc:
        raise InvalidInputError(str(exc)) from None
    if priority is None:
        priority = definition.priority
    if priority is None:
        priority = settings.AGENTFLOW_DEFAULT_PRIORITY
    digest = ""
    if definition.concurrency_key is not None:
        key = _concurrency.key_of(definition.name, definition.concurrency_key, payload)
        digest = _concurrency.digest(definition.name, key)
    return NewRun(
        workflow=definition,
        input=payload,
        business_key=business_key,
        priority=priority,
        concurrency_key=digest,
    )


def start_children(
    ctx: StepContext | AgentContext,
    children: Iterable[tuple[str, Any, str | None]],
    *,
    compensate: str | EllipsisType | None = ...,
    priority: int | None = None,
) -> list[str]:
    """From a step, or a call of an agent workflow: start its child runs, each (workflow,
    input, key), and return their ids.

    Each child's business key is `<this run>:<this step's position>:<key>` (the child's index
    when `key` is None), so the step run again starts none twice and returns the same ids.
    In an agent workflow the start is a call of its own (`db`: the children's rows commit
    with its checkpoint), replayed from its record, and `compensate` is required: the name of
    a compensation the workflow declares (`durable.cancel_children`: the run failed or
    cancelled cancels them), or None (they are left to finish). A graph step declares its
    compensation itself. `priority`: the children's, as `start_many`'s."""
    if isinstance(ctx, AgentContext):
        chosen = _compensation(ctx.workflow, compensate)
        given = [tuple(entry) for entry in children]
        found = ctx.step(
            START_CALL,
            lambda step_ctx: {
                "children": start_children(step_ctx, given, priority=priority),
                "compensate": chosen,
            },
            kind=StepKind.DB,
            arguments={"children": given, "priority": priority},
        )
        # A call recorded before its record named a compensation: its ids alone.
        return found if isinstance(found, list) else found["children"]  # type: ignore[no-any-return]
    if compensate is not ...:
        raise DefinitionError(
            f"{ctx.workflow}: {ctx.step}: a graph step declares what undoes it "
            "(step(..., compensate=...) naming durable.cancel_children), not start_children"
        )
    prefix = f"{ctx.run_id}:{ctx.seq}:"
    keyed = []
    for index, entry in enumerate(children):
        try:
            workflow, given, key = entry
        except (TypeError, ValueError):
            raise InvalidInputError(
                f"each child is (workflow, input, key), not {entry!r}"
            ) from None
        keyed.append((workflow, given, prefix + (str(index) if key is None else str(key))))
    return start_many(keyed, parent=(ctx.run_id, ctx.seq), priority=priority)


def _compensation(workflow: CodeWorkflow, compensate: str | EllipsisType | None) -> str | None:
    """The compensation an agent run's start names, checked: one its workflow declares, or
    None; not saying is a mistake (the children's fate is chosen, never defaulted)."""
    if compensate is ...:
        raise DefinitionError(
            f"{workflow.name}: start_children(ctx, ..., compensate=...) says what happens to "
            "the children if this run fails or is cancelled: the name of a compensation it "
            "declares with durable.cancel_children (cancel them), or None (leave them)"
        )
    if compensate is None:
        return None
    step = workflow.steps.get(compensate) if isinstance(compensate, str) else None
    if step is None or not step.compensation_only:
        raise DefinitionError(
            f"{workflow.name}: start_children names {compensate!r} as its compensation, but "
            f"the workflow declares none of that name ({workflow.name}.compensation(...))"
        )
    return compensate


def started_children(ctx: StepContext) -> list[str]:
    """The children this step started (empty: none yet): what a reconcile of the step adopts."""
    return store.children_ids(ctx.run_id, ctx.seq)


def wait_for_children(
    workflow: Workflow | AgentContext,
    name: str = "",
    *,
    wait: str = "all",
    next: Callable[[Any], str] | None = None,
) -> Any:
    """In a graph workflow, declare step `name` of `workflow`: wait for the children the
    latest earlier step started, for all of them or for the first to end. WAITING meanwhile,
    holding no worker; its output is `{"payload": report}` (see `report`).

    In an agent workflow, called with its context: the same wait, for the children of its
    latest earlier `start_children`, as a call of its own; returns the report."""
    if isinstance(workflow, AgentContext):
        if wait not in WAITS:
            raise DefinitionError(f"{WAIT_CALL}: wait is one of {WAITS}, not {wait!r}")
        call = WaitCall(
            name=WAIT_CALL,
            arguments={"wait": wait},
            spec=WaitSpec(kind=WaitKind.SIGNAL, name=WAIT_CALL),  # counted: see waits_for
            waits_for=_waits_for(WAIT_CALL, wait),
        )
        return workflow.wait_call(call)["payload"]
    if wait not in WAITS:
        raise DefinitionError(f"{workflow.name}: {name!r}: wait is one of {WAITS}, not {wait!r}")
    workflow._add(  # a wait step, as `Workflow.wait_for` declares one
        name,
        kind=StepKind.READ,
        next=next,
        compensation_only=False,
        waits_for=_waits_for(name, wait),
    )(_waited)


def _waits_for(name: str, wait: str) -> Callable[[StepContext], WaitSpec]:
    """The wait at the step (or call) `name`: the children of the latest earlier position
    that started some, counted as the run gets there and at every look after."""

    def waits_for(ctx: StepContext) -> WaitSpec:
        started = store.children_started_at(ctx.run_id, ctx.seq)
        if started is None:
            raise PermanentStepError(f"{name}: no earlier step of this run started children")
        signal = f"{SIGNAL_PREFIX}{started}"
        counts = store.children_counts(ctx.run_id, started)
        ended = sum(counts.get(status, 0) for status in TERMINAL_RUN_STATUSES)
        if ended == sum(counts.values()) or (wait == "first" and ended):
            store.signal_keep(
                ctx.run_id, signal, report(ctx.run_id, started, wait), signal_id=signal
            )
        return WaitSpec(kind=WaitKind.SIGNAL, name=signal, recheck_seconds=RECHECK_SECONDS)

    waits_for.counts_children = True  # type: ignore[attr-defined]  # `store.parents` rings it
    return waits_for


def _waited(ctx: StepContext) -> Any:
    raise AssertionError(f"{ctx.step}: a wait's output is the engine's record, not a function's")


def report(parent_id: str, seq: int, wait: str) -> dict[str, Any]:
    """What the wait hands its step: `counts` by status, and each child that ended (`run_id`,
    `workflow`, `business_key`, `status`, `error`; the first's `output` too, for "first"), so a
    child's failure is a value the parent acts on."""
    ended = store.children_ended(parent_id, seq, limit=1 if wait == "first" else None)
    children = [_ending(child, output=wait == "first") for child in ended]
    return {"wait": wait, "counts": store.children_counts(parent_id, seq), "children": children}


def _ending(child: ChildEnd, *, output: bool) -> dict[str, Any]:
    found = {
        "run_id": child.run_id,
        "workflow": child.workflow,
        "business_key": child.business_key,
        "status": child.status,
        "error": child.error,
    }
    if output:
        found["output"] = child.output
    return found


def cancel_children(ctx: StepContext) -> dict[str, Any]:
    """A compensation to declare for the step (or agent call) that starts children: a parent
    that fails for good or is cancelled cancels every child that start made still unfinished
    (each undoes what it did, as `durable.cancel`), and returns `{"cancelled": [ids],
    "refused": {id: reason}}` (refused: finished or cancelling already, so running it again
    cancels none twice). Without it, a parent that stops leaves its children to finish."""
    seq = ctx.undoes.seq if ctx.undoes is not None else None  # None: every child (on_failure)
    return _cancel_active(ctx.run_id, "its parent run failed or was cancelled", seq)


def _cancel_active(parent_id: str, reason: str, seq: int | None = None) -> dict[str, Any]:
    cancelled, refused = [], {}
    for child in store.children_active(parent_id, seq):
        try:
            store.run_cancel(child, actor=f"parent {parent_id}"[:150], reason=reason)
        except store.ActionRefused as exc:
            refused[child] = str(exc)
        else:
            cancelled.append(child)
    return {"cancelled": cancelled, "refused": refused}


def cancel(run_id: str, *, actor: str, reason: str) -> str | None:
    """An operator's cancel (`durable.cancel`, the console's Cancel): the run is cancelled, and
    the children its compensations will cancel (`cancel_children`) are too, at once, in the
    operator's request, rather than when the parent's compensation gets its turn behind the
    children's own steps (the compensation then finds them cancelling, and changes nothing;
    if this request dies between the two, the compensation still cancels them)."""
    outcome = store.run_cancel(run_id, actor=actor, reason=reason)
    why = f"its parent run was cancelled by {actor}: {reason}"
    for seq in _cancelled_with(run_id):
        _cancel_active(run_id, why, seq)
    return outcome


def _cancelled_with(run_id: str) -> list[int | None]:
    """The starts whose children the run's compensations cancel, as positions (None: all its
    children, a `cancel_children` that undoes no one start): those its plan holds, by the
    same rule that plans them (`store.compensation_plan`)."""
    run = WorkflowRun.objects.filter(pk=run_id).values("workflow", "version", "current_seq")
    found = run.first()
    workflow = registry.lookup(found["workflow"], found["version"]) if found else None
    if found is None or workflow is None:
        return []
    starts: list[int | None] = []
    for name in store.compensation_plan(run_id, workflow, found["current_seq"] + 1):
        step = workflow.step_named(name)
        if step is not None and step.compensation_only and step.fn is cancel_children:
            target = undo_target(name)
            starts.append(target[1] if target is not None else None)
    return starts


__all__: Sequence[str] = (
    "cancel",
    "cancel_children",
    "report",
    "start_children",
    "start_many",
    "started_children",
    "wait_for_children",
)
