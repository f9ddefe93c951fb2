"""A read step run straight from its message, before its run is loaded, and the step context
every attempt is given.

A read step's message carries the run's input when the publisher had it (`dispatch.fresh_hint`):
the worker runs the step, then records it in one statement fenced on all the message claimed.
That is one round trip per read step instead of two (load, then complete); SPEC 3.3 lets a read
fold its claim into its completion, and a read has no effect to order a claim before.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from agentflow import dispatch, faults, registry, store, telemetry
from agentflow.agent.loop import CodeWorkflow
from agentflow.context import StepContext
from agentflow.registry import StepDef
from agentflow.serialization import to_json
from agentflow.states import StepKind


@dataclass(frozen=True, kw_only=True)
class Ahead:
    """A read step run from its message, before its run was loaded (`read_ahead`)."""

    done: bool
    step: str = ""
    workflow: str = ""
    version: int = 0
    input: Any = None
    output: Any = None
    error: Exception | None = None

    def answers(
        self, run: store.StepState, step: StepDef, seen: store.CheckpointRow | None
    ) -> bool:
        """Is this the first attempt of `step` that the loaded `run` is waiting for? Then its
        result stands: a read step is run once per attempt, whoever loads the run."""
        return (
            seen is None
            and (run.workflow, run.version, step.name) == (self.workflow, self.version, self.step)
            and run.input == self.input
        )

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.output


def read_ahead(run_id: str, seq: int, fresh: dispatch.Fresh | None) -> Ahead | None:
    """A fresh read step whose message carries the run's input: run it, then record it in one
    statement fenced on everything the message claimed (the run at `seq` on this step, this
    definition and input, not cancelling, no checkpoint), so the step costs one round trip.

    A read changes nothing outside, so running it for a run that moved on meanwhile is
    harmless; then nothing is recorded and the caller loads the run and goes on as usual, with
    this attempt's result if it is still the one wanted."""
    if fresh is None or len(fresh) != 4:
        return None
    name, version, step_name, carried = fresh
    workflow = registry.lookup(str(name), int(version))
    if workflow is None or isinstance(workflow, CodeWorkflow):
        return None
    step = workflow.steps.get(str(step_name))
    if step is None or step.kind != StepKind.READ or step.compensation_only:
        return None
    if step.waits_for is not None:
        return None  # its wait (a timer, a signal, an approval) is settled on load first
    assumed = store.fresh_read_state(run_id, seq, workflow, step.name, carried["input"])
    ahead = partial(
        Ahead,
        step=step.name,
        workflow=workflow.name,
        version=workflow.version,
        input=assumed.input,
    )
    try:
        output = to_json(
            step.fn(step_context(assumed, step, seq, 1)), f"output of step {step.name}"
        )
    except Exception as exc:
        return ahead(done=False, error=exc)
    faults.crash_point(step.name, "after_effect", 1)
    if store.unclaimed_complete(assumed, workflow, step, seq, None, output, assumed=True):
        return ahead(done=True)
    return ahead(done=False, output=output)


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
