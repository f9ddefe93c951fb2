"""The context each attempt of a graph step is given, built from the run as loaded (and the
worker's telemetry learns the attempt started): shared by claimed and unclaimed steps."""

from __future__ import annotations

from agentflow import _store as store
from agentflow._base.context import StepContext
from agentflow._core import registry
from agentflow._core.registry import StepDef
from agentflow._observe import telemetry


def step_context(run: store.StepState, step: StepDef, seq: int, attempt: int) -> StepContext:
    """What `step` sees at `seq` on this attempt (and the worker's telemetry learns it started)."""
    telemetry.step_started(
        run_id=run.id,
        workflow=run.workflow,
        seq=seq,
        step=step.name,
        kind=step.kind,
        attempt=attempt,
    )
    view = getattr(registry.lookup(run.workflow, run.version), "outputs_view", None)
    # A compensation sees every branch's calls (it tells the customer about the booking
    # whichever branch fetched it) and is handed the exact call it undoes.
    every_branch = step.compensation_only
    undoes = (step.arguments or {}).get("undoes") if every_branch else None
    return StepContext(
        run_id=run.id,
        workflow=run.workflow,
        seq=seq,
        step=step.name,
        attempt=attempt,
        input=run.input,
        load_outputs=lambda: (view or dict)(
            store.outputs_load(run.id, seq, every_branch=every_branch)
        ),
        key=step.key,
        undoes=store.undone_call(run.id, **undoes) if undoes else None,
        load_calls=lambda: store.calls_load(run.id, seq),
        decision=step.decision,
    )
