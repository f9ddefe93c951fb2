"""Agent runs' history: the recorded calls a replay returns, ending a run when its
function returns, and the superseded calls of a forked run that a new branch may reuse."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from agentflow._base.context import UndoneCall
from agentflow._base.states import RunStatus, StepKind, StepStatus
from agentflow._core.registry import Workflow
from agentflow._store import sql
from agentflow._store.concurrency import concurrency_run_ended_id
from agentflow._store.parents import run_ended
from agentflow._store.runs import Fenced, begin_undo, run_park
from agentflow._store.steps import ACTIVE, CheckpointRow, state_load
from agentflow.models import RunEvent, StepCheckpoint, SupersededStep


@dataclass(frozen=True, kw_only=True)
class RecordedCall:
    """A checkpoint as stored: its position, what was called, and what came back."""

    seq: int
    name: str
    kind: str
    status: str
    attempts: int
    arguments: Any
    output: Any
    idempotency_key: str


#: A checkpoint as a replay reads it: its name, status, fingerprint digest (empty for a call
#: recorded before the digest had a column) and output. A plain tuple: a replay reads one per
#: position, and builds nothing per row.
ReplayedCall = tuple[str, str, str, Any]


_CALL_FIELDS = (
    "seq",
    "name",
    "kind",
    "status",
    "attempts",
    "arguments",
    "output",
    "idempotency_key",
)


def replay_load(run_id: str, before_seq: int) -> dict[int, ReplayedCall]:
    """The run's checkpoints before `before_seq` by position, as a replay reads them (one query):
    their digests, not their arguments, which hold a model turn's messages and are read
    only when a digest differs (`calls_load`). Every output is parsed in one go."""
    rows = sql.fetch_all(
        f"""SELECT seq, name, status, digest, output FROM {sql.STEPS}
        WHERE run_id = %s AND seq < %s ORDER BY seq""",
        [run_id, before_seq],
    )
    seqs, names, statuses, digests, outputs = zip(*rows, strict=True) if rows else ((),) * 5
    calls = zip(names, statuses, digests, sql.read_json_many(outputs), strict=True)
    return dict(zip(seqs, calls, strict=True))


def model_attempts(run_id: str, before_seq: int) -> dict[int, int]:
    """The attempts of the run's model turns before `before_seq`, by position (one query): each
    was claimed, and so counted, before its request was sent, so an attempt that recorded no
    answer is a request that may have been billed (`agentflow.agent.budget`)."""
    rows = sql.fetch_all(
        f"""SELECT seq, attempts FROM {sql.STEPS}
        WHERE run_id = %s AND seq < %s AND kind = %s ORDER BY seq""",
        [run_id, before_seq, StepKind.LLM],
    )
    return {seq: attempts for seq, attempts in rows}


#: How many recent first model turns of a workflow a first request near its cap is bounded
#: from (`model_first_turns`).
FIRST_TURNS_LOOKED_AT = 20


def model_first_turns(workflow: str, *, but: str) -> list[tuple[Any, Any]]:
    """The latest recorded first model turns of other runs of `workflow` (those whose request
    was stored with its tools: a replay's first), as (arguments, output): what reported the
    tokens a new run's first request shares with them (`agentflow.agent.budget`). Read only
    when a first request is near a cap."""
    rows = sql.fetch_all(
        f"""SELECT s.arguments, s.output FROM {sql.STEPS} s JOIN {sql.RUNS} r ON r.id = s.run_id
        WHERE r.workflow = %s AND s.run_id <> %s AND s.kind = %s AND s.status = %s
        ORDER BY s.id DESC LIMIT %s""",
        [workflow, but, StepKind.LLM, StepStatus.COMPLETED, FIRST_TURNS_LOOKED_AT * 4],
    )
    if not rows:
        return []
    arguments, outputs = zip(*rows, strict=True)
    found = [
        (stored, output)
        for stored, output in zip(
            sql.read_json_many(arguments), sql.read_json_many(outputs), strict=True
        )
        if isinstance(stored, dict)
        and isinstance(stored.get("arguments"), dict)
        and "tools" in stored["arguments"]
    ]
    return found[:FIRST_TURNS_LOOKED_AT]


def calls_load(run_id: str, before_seq: int) -> list[RecordedCall]:
    """Every checkpoint of the run before `before_seq`, whole as stored, in order (one query):
    tool calls with their arguments for a tool's history, model turns with the messages they
    added for a divergence's diff."""
    rows = sql.fetch_all(
        f"""SELECT {", ".join(_CALL_FIELDS)} FROM {sql.STEPS}
        WHERE run_id = %s AND seq < %s ORDER BY seq""",
        [run_id, before_seq],
    )
    return [_recorded(row) for row in rows]


def _recorded(row: tuple[Any, ...]) -> RecordedCall:
    seq, name, kind, status, attempts, arguments, output, key = row
    return RecordedCall(
        seq=seq,
        name=name,
        kind=kind,
        status=status,
        attempts=attempts,
        arguments=sql.read_json(arguments),
        output=sql.read_json(output),
        idempotency_key=key,
    )


def superseded_reusable(run_id: str, workflow: Workflow) -> list[RecordedCall]:
    """Completed calls of earlier branches whose key no current checkpoint has taken yet: a
    new branch that makes the same call adopts one instead of acting again. Compensations are
    never reused: they undo a call, they are not one the function makes."""
    taken = StepCheckpoint.objects.filter(run_id=run_id).values("idempotency_key")
    rows = (
        SupersededStep.objects.filter(run_id=run_id, status=StepStatus.COMPLETED)
        .exclude(idempotency_key__in=taken)
        .order_by("branch", "seq")
        .values(*_CALL_FIELDS)
    )
    calls = [RecordedCall(**row) for row in rows]
    return [call for call in calls if not _is_compensation(workflow, call.name)]


def _is_compensation(workflow: Workflow, name: str) -> bool:
    step = workflow.step_named(name)
    return step is not None and step.compensation_only


def undone_call(run_id: str, *, seq: int, branch: int | None) -> UndoneCall | None:
    """The call a compensation undoes: at `seq` of the run's current branch (`branch` None),
    or of the branch a fork set aside."""
    if branch is None:
        found = (
            StepCheckpoint.objects.filter(run_id=run_id, seq=seq)
            .values(*_CALL_FIELDS, "run__branch")
            .first()
        )
        if found is None:
            return None
        branch = found.pop("run__branch")
    else:
        found = (
            SupersededStep.objects.filter(run_id=run_id, branch=branch, seq=seq)
            .values(*_CALL_FIELDS)
            .first()
        )
        if found is None:
            return None
    return UndoneCall(
        name=found["name"],
        seq=seq,
        branch=branch,
        status=found["status"],
        arguments=found["arguments"],
        output=found["output"],
        idempotency_key=found["idempotency_key"],
    )


def run_finish(run_id: str, seq: int, output: Any) -> bool:
    """The run's function returned after its last call: COMPLETED with its return value, in
    one statement fenced on the run being active at `seq` with no call recorded there."""
    fence = f"""id = %s AND current_seq = %s AND status IN ({sql.placeholders(ACTIVE)})
        AND NOT EXISTS (SELECT 1 FROM {sql.STEPS} c WHERE c.run_id = %s AND c.seq = %s)"""
    finished = bool(
        sql.update(
            sql.RUNS,
            {
                "status": RunStatus.COMPLETED,
                "output": output,
                "wake_at": None,
                "updated_at": sql.at_now(),
            },
            fence,
            [run_id, seq, *ACTIVE, run_id, seq],
        )
    )
    if finished:
        run_ended(run_id)
        concurrency_run_ended_id(run_id)
    return finished


def run_fail_between_calls(run_id: str, workflow: Workflow, seq: int, reason: str) -> bool:
    """The run's function raised (a guardrail, a budget, a refusal) before its next call: fail
    the run, undoing the effects known to have happened. Fenced like `run_finish`.

    When an attempt of a call is recorded at `seq` (the function made it before and no longer
    does), the run is parked instead, fenced on that checkpoint: failing would forget an attempt
    that may have acted, and doing nothing would have it republished for ever. A live owner's
    attempt is left to finish first: its completion moves the run on.
    """
    with transaction.atomic():
        state = state_load(run_id, seq, lock=True)
        if state is None or state.status not in ACTIVE or state.current_seq != seq:
            return False
        recorded = state.checkpoint
        if recorded is not None:
            if recorded.status == StepStatus.IN_PROGRESS and not recorded.claimable:
                return False
            return _park_over(run_id, seq, recorded, reason)
        try:
            begin_undo(state, workflow, seq=seq, reason=reason)
        except Fenced:
            return False
    return True


def _park_over(run_id: str, seq: int, recorded: CheckpointRow, reason: str) -> bool:
    attempt = f"{recorded.name} at position {seq} (attempt {recorded.attempts}, {recorded.status})"
    if recorded.kind == StepKind.EFFECT:
        message = (
            f"outcome unknown: {attempt} may have acted, and the function now raises before "
            f"making that call: {reason}; check the partner, then retry or fork"
        )
        kind = RunEvent.Kind.OUTCOME_UNKNOWN
    else:
        message = f"the function now raises before making its recorded call {attempt}: {reason}"
        kind = RunEvent.Kind.NEEDS_ATTENTION
    return run_park(
        run_id,
        seq,
        message,
        kind=kind,
        fence=recorded.fence,
        data={"attempt": recorded.attempts, "fence": recorded.fence, "error": reason[:1000]},
    )
