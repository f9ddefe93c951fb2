"""A step that waits (docs/workflows.md, "Timers, signals and approvals"): before it runs, its
timer, signal or approval is settled with the store, and the step runs as what that wait decided.

Timers and signals end in the wait's outcome, recorded as the step's output (a `read`: nothing
acts). An approved call runs as declared, with `ctx.decision`; a rejected or timed-out one does
not run: its step records the rejection instead, as a `read`, so nothing counts it as an effect
that may have happened and nothing compensates it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentflow import _store as store
from agentflow._base.context import Decision, StepContext
from agentflow._base.states import StepKind, WaitKind
from agentflow._core import registry
from agentflow._core.registry import StepDef


def settle(run: store.StepState, step: StepDef, seq: int) -> StepDef | None:
    """The step to run now that its wait is over, or None while it waits (the run is
    WAITING, no worker held) or when the run moved on meanwhile. Raises what the workflow's
    own predicate or arguments function raises."""
    assert step.waits_for is not None
    spec = step.waits_for(_context(run, step, seq))
    if spec is None:
        return replace(step, waits_for=None)  # its predicate says this call needs no approval
    outcome = store.wait_settle(run, spec, seq)
    if outcome is None:
        return None
    if spec.kind != WaitKind.APPROVAL:
        return _recorded(step, outcome)
    decision = Decision.from_json(outcome)
    if decision.approved:
        return replace(step, waits_for=None, decision=decision)
    rejected = spec.rejected(outcome) if spec.rejected is not None else outcome
    return replace(_recorded(step, rejected), decision=decision)


def _recorded(step: StepDef, output: Any) -> StepDef:
    return replace(
        step,
        kind=StepKind.READ,
        fn=lambda ctx: output,
        reconcile=None,
        waits_for=None,
    )


def _context(run: store.StepState, step: StepDef, seq: int) -> StepContext:
    """What a predicate or an arguments function sees: the step's context before it runs."""
    view = getattr(registry.lookup(run.workflow, run.version), "outputs_view", None)
    return StepContext(
        run_id=run.id,
        workflow=run.workflow,
        seq=seq,
        step=step.name,
        attempt=0,
        input=run.input,
        load_outputs=lambda: (view or dict)(store.outputs_load(run.id, seq)),
        key=step.key,
    )
