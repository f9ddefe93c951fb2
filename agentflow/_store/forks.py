"""An operator's fork of an agent run: its calls from a position on are set aside as
superseded history and it continues there on a new branch.

A fork never sets aside what it does not know (docs/protocol.md, "Operator actions"): it is refused
while any call is IN_PROGRESS with a live owner, while the run's undo has started, and past an
effect that may have happened unless the partner was asked just before (`Settled`) and nothing moved
since.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from agentflow._base import outcomes
from agentflow._base.states import RunStatus, StepStatus
from agentflow._core import dispatch, registry
from agentflow._core.registry import NEXT_CALL, CodeDefined, Workflow
from agentflow._store import sql
from agentflow._store.events import event_add
from agentflow._store.operator import locked_run, refuse_if_undone, wake_soon
from agentflow.exceptions import ActionRefused
from agentflow.models import RunEvent, StepCheckpoint, SupersededStep, WorkflowRun


@dataclass(frozen=True, kw_only=True)
class Settled:
    """What the partner said, just before a fork, of a set-aside effect whose outcome was
    unknown. `fence`: the checkpoint's when asked (a claim since makes the answer stale)."""

    fence: int
    #: True: found, and `output` is adopted; False: proven absent; None: it could not tell.
    happened: bool | None
    output: Any = None
    why: str = ""


def fork_preview(run_id: str, position: int) -> list[StepCheckpoint]:
    """The checkpoints a fork from `position` would set aside, in order (what the operator is
    shown before confirming: above all, effects that happened)."""
    return list(StepCheckpoint.objects.filter(run_id=run_id, seq__gte=position).order_by("seq"))


def live_calls(run_id: str) -> list[tuple[int, str]]:
    """Calls of the run IN_PROGRESS with a live owner (database clock): position and name."""
    rows = sql.fetch_all(
        f"SELECT c.seq, c.name FROM {sql.STEPS} c WHERE c.run_id = %s AND c.status = %s "
        f"AND NOT {sql.claimable('c')} ORDER BY c.seq",
        [run_id, StepStatus.IN_PROGRESS],
    )
    return [(int(seq), str(name)) for seq, name in rows]


def _unsettled(cp: StepCheckpoint) -> bool:
    return outcomes.unsettled(kind=cp.kind, status=cp.status, retryable=cp.retryable)


def run_fork(
    run_id: str,
    *,
    position: int,
    actor: str,
    reason: str,
    settled: Mapping[int, Settled] | None = None,
) -> None:
    """Continue a diverged or failed agent run from `position`, on a new branch.

    Its checkpoints from `position` on are kept as superseded history (still shown, never
    replayed); the run resumes at `position`. A call the new branch makes again with the same
    arguments reuses the superseded result and key (it is not made again); every other new call
    gets a key that names the branch, so no partner mistakes it for an earlier one. `settled`:
    the partner's answers for set-aside effects whose outcome was unknown, by position.
    """
    answers = settled or {}
    with transaction.atomic():
        run = locked_run(run_id)
        workflow = registry.lookup(run.workflow, run.version)
        if not isinstance(workflow, CodeDefined):
            raise ActionRefused("only agent (agent) runs can be forked")
        if run.status not in (RunStatus.NEEDS_ATTENTION, RunStatus.FAILED):
            raise ActionRefused(
                f"only diverged, parked or failed runs can be forked (this one is {run.status})"
            )
        _refuse_if_undoing(run, workflow)
        live = live_calls(run_id)
        if live:
            seq, name = live[0]
            raise ActionRefused(
                f"{name} (position {seq}) is running on a live worker; a fork would race it: "
                "wait for it to finish"
            )
        last = StepCheckpoint.objects.filter(run_id=run_id).order_by("-seq").first()
        highest = (last.seq if last else 0) + 1
        if not 1 <= position <= highest:
            raise ActionRefused(f"position must be between 1 and {highest}")
        superseded = fork_preview(run_id, position)
        for cp in superseded:
            if _unsettled(cp):
                _apply_answer(run_id, cp, answers.get(cp.seq))
        now = sql.db_now()
        SupersededStep.objects.bulk_create(
            SupersededStep(
                run_id=run_id,
                branch=run.branch,
                seq=cp.seq,
                name=cp.name,
                kind=cp.kind,
                status=cp.status,
                attempts=cp.attempts,
                idempotency_key=cp.idempotency_key,
                arguments=cp.arguments,
                output=cp.output,
                error=cp.error,
                started_at=cp.started_at,
                finished_at=cp.finished_at,
                superseded_at=now,
            )
            for cp in superseded
        )
        StepCheckpoint.objects.filter(run_id=run_id, seq__gte=position).delete()
        sql.update(
            sql.RUNS,
            {
                "status": RunStatus.RUNNING,
                "branch": run.branch + 1,
                # A stale worker's claim on a set-aside checkpoint must match nothing new.
                "fence_floor": max([run.fence_floor, *(cp.fence for cp in superseded)]),
                "current_seq": position,
                "current_step": NEXT_CALL,
                "batch_last": None,
                "compensations": [],
                "cancel_requested": False,
                "error": "",
                "wake_at": wake_soon(),
                "updated_at": sql.at_now(),
            },
            "id = %s",
            [run_id],
        )
        event_add(
            run_id,
            RunEvent.Kind.FORK,
            f"{reason or '(no reason given)'} (from position {position}; "
            f"{len(superseded)} step(s) set aside as branch {run.branch})",
            actor=actor,
            seq=position,
            data={
                "position": position,
                "branch": run.branch + 1,
                "superseded": [
                    {
                        "seq": cp.seq,
                        "name": cp.name,
                        "kind": cp.kind,
                        "status": cp.status,
                        "key": cp.idempotency_key,
                    }
                    for cp in superseded
                ],
            },
        )
        dispatch.send_step_on_commit(run_id, position)


def _refuse_if_undoing(run: WorkflowRun, workflow: Workflow) -> None:
    """A run whose undo has started is not forked: the new branch would not know what was
    given back (and would give it back again). Its Retry finishes the undo."""
    step = workflow.step_named(run.current_step)
    if run.status != RunStatus.FAILED and step is not None and step.compensation_only:
        raise ActionRefused(
            f"its undo has started ({run.current_step} is next): a new branch would not know "
            "what was given back; Retry finishes the undo"
        )
    refuse_if_undone(run)


def _apply_answer(run_id: str, cp: StepCheckpoint, answer: Settled | None) -> None:
    """Set aside an effect whose outcome was unknown as the partner answered: found, COMPLETED
    with its output (the new branch adopts it, or the run undoes it); absent, FAILED for good.
    No answer, a stale one, or "cannot tell": the fork is refused."""
    if answer is None or answer.fence != cp.fence:
        raise ActionRefused(
            f"whether {cp.name} (position {cp.seq}) took effect is unknown; a new branch could "
            "repeat it: check the partner, or fork after it"
        )
    if answer.happened is None:
        raise ActionRefused(
            f"whether {cp.name} (position {cp.seq}) took effect is unknown and the partner "
            f"could not say ({answer.why}); a new branch could repeat it: fork after it"
        )
    if answer.happened:
        cp.status, cp.output, cp.error = StepStatus.COMPLETED, answer.output, ""
        detail = f"{cp.name}: effect found at the partner before the fork; adopted"
    else:
        cp.status, cp.retryable = StepStatus.FAILED, False
        cp.error = "the partner confirms it did not happen (asked before the fork)"
        detail = f"{cp.name}: the partner has no such effect; set aside as not made"
    event_add(
        run_id,
        RunEvent.Kind.RECONCILED,
        detail,
        seq=cp.seq,
        data={"fence": cp.fence, "output": answer.output, "happened": answer.happened},
    )
