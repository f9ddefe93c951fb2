"""The step hot path: load, claim, renew, complete, advance. Raw SQL, one commit each.

A `read` step costs one commit (completion and advance together), an `effect` step two (the
claim before the call, the fenced completion after). Every write is a compare-and-set whose
row count decides who won.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from agentflow import dispatch, faults, leases, telemetry
from agentflow.context import idempotency_key
from agentflow.registry import StepDef, Workflow
from agentflow.states import ACTIVE_RUN_STATUSES, RunStatus, StepStatus
from agentflow.store import sql
from agentflow.store.runs import enqueue_grace

_ACTIVE: list[str] = [str(status) for status in ACTIVE_RUN_STATUSES]
#: The fence of every run update: still active, still at this step.
_RUN_AT_STEP = f"id = %s AND current_seq = %s AND status IN ({sql.placeholders(_ACTIVE)})"


@dataclass(slots=True, kw_only=True)
class CheckpointRow:
    id: int
    name: str
    status: str
    attempts: int
    retryable: bool
    lease_owner: str
    lease_expires_at: datetime | None
    first_started_at: datetime


@dataclass(slots=True, kw_only=True)
class StepState:
    """A run and its checkpoint at one seq, read in a single query."""

    id: str
    workflow: str
    version: int
    input: Any
    status: str
    current_step: str
    current_seq: int
    compensations: list[str]
    error: str
    #: When the sweeper looks again: lease expiry, retry time + grace, or enqueue grace.
    wake_at: datetime | None
    checkpoint: CheckpointRow | None


_STATE_COLUMNS = """
    r.workflow, r.version, r.input, r.status, r.current_step, r.current_seq, r.compensations,
    r.error, c.id, c.name, c.status, c.attempts, c.retryable, c.lease_owner, c.lease_expires_at,
    c.first_started_at, r.wake_at
"""
_STATE_FROM = f"""
    FROM {sql.RUNS} r
    LEFT JOIN {sql.STEPS} c ON c.run_id = r.id AND c.seq = %s
    WHERE r.id = %s
"""
_STATE_QUERY = f"SELECT {_STATE_COLUMNS} {_STATE_FROM}"


def state_load(run_id: str, seq: int, *, lock: bool = False) -> StepState | None:
    """The run and its checkpoint at `seq`. With `lock`, the run row stays locked until the
    caller's transaction ends (a `db` step holds it while its writes happen)."""
    query = _STATE_QUERY
    if lock and connection.features.has_select_for_update_of:
        query += " FOR UPDATE OF r"  # SQLite needs none: IMMEDIATE transactions serialise
    return _state_from_row(run_id, sql.fetch_one(query, [seq, run_id]))


def _state_from_row(run_id: str, row: tuple[Any, ...] | None) -> StepState | None:
    if row is None:
        return None
    checkpoint = None
    if row[8] is not None:
        checkpoint = CheckpointRow(
            id=row[8],
            name=row[9],
            status=row[10],
            attempts=row[11],
            retryable=bool(row[12]),
            lease_owner=row[13],
            lease_expires_at=sql.read_datetime(row[14]),
            first_started_at=sql.read_datetime(row[15]),  # type: ignore[arg-type]
        )
    return StepState(
        id=run_id,
        workflow=row[0],
        version=row[1],
        input=sql.read_json(row[2]),
        status=row[3],
        current_step=row[4],
        current_seq=row[5],
        compensations=sql.read_json(row[6]) or [],
        error=row[7],
        wake_at=sql.read_datetime(row[16]),
        checkpoint=checkpoint,
    )


def _lease_expiry(now: datetime) -> datetime:
    return now + timedelta(seconds=settings.AGENTFLOW_LEASE_SECONDS)


#: Claims the step at `seq` when it is still fresh (run PENDING or RUNNING at that seq and step,
#: on the expected definition, no checkpoint), then reads the state as it was before the claim:
#: the sub-statements of one statement share a snapshot. A racing claimer makes the INSERT fail
#: on unique (run, seq), so the whole statement changes nothing.
_LOAD_AND_CLAIM_QUERY = f"""
    WITH claimed_run AS (
        UPDATE {sql.RUNS} r SET status = %s, wake_at = %s, updated_at = %s
        WHERE r.id = %s AND r.current_seq = %s AND r.status IN (%s, %s)
          AND r.workflow = %s AND r.version = %s AND r.current_step = %s
          AND NOT EXISTS (SELECT 1 FROM {sql.STEPS} c WHERE c.run_id = r.id AND c.seq = %s)
        RETURNING r.id
    ), claimed AS (
        INSERT INTO {sql.STEPS} (run_id, seq, name, kind, idempotency_key, status, attempts,
                                 retryable, error, lease_owner, lease_expires_at, started_at,
                                 first_started_at)
        SELECT id, %s, %s, %s, %s, %s, 1, false, '', %s, %s, %s, %s FROM claimed_run
        RETURNING id
    )
    SELECT {_STATE_COLUMNS}, (SELECT id FROM claimed) {_STATE_FROM}
"""


def state_load_claiming(
    run_id: str, seq: int, workflow: Workflow, step: StepDef
) -> tuple[StepState | None, Claim | None]:
    """`state_load`, and the claim of `step` (an effect or llm step of `workflow`) in the same
    statement when the run has just been moved onto it: one round trip fewer for a fresh
    effect step. The claim is exactly the one `step_claim` would commit after the caller's
    checks, which hold by the statement's fences; in any other case (a checkpoint exists,
    another definition, a race) nothing is claimed and the caller decides as usual."""
    if connection.vendor != "postgresql":
        return state_load(run_id, seq), None
    now = timezone.now()
    expires = _lease_expiry(now)
    params = [
        RunStatus.RUNNING, expires, now,
        run_id, seq, RunStatus.PENDING, RunStatus.RUNNING,
        workflow.name, workflow.version, step.name,
        seq,
        seq, step.name, step.kind, idempotency_key(run_id, seq), StepStatus.IN_PROGRESS,
        leases.current_owner(), expires, now, now,
        seq, run_id,
    ]  # fmt: skip
    try:
        row = sql.fetch_one(_LOAD_AND_CLAIM_QUERY, params)
    except IntegrityError:
        return state_load(run_id, seq), None  # another worker claimed it first
    state = _state_from_row(run_id, row)
    if row is None or row[17] is None:
        return state, None
    return state, Claim(attempt=1, outcome_unknown=False, first_started_at=now)


# --- claims -------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Claim:
    attempt: int
    #: The step was IN_PROGRESS under a lost lease: its effect may or may not have happened.
    outcome_unknown: bool
    first_started_at: datetime


def claim_blocker(cp: Any, now: datetime) -> str | None:
    """Why checkpoint `cp` cannot be claimed now, or None when it can (SPEC §3.3 step 3)."""
    if cp is None:
        return None
    if cp.status == StepStatus.COMPLETED:
        return "completed"
    if cp.status == StepStatus.FAILED:
        return None if cp.retryable else "failed"
    assert cp.lease_expires_at is not None
    if cp.lease_expires_at <= now or leases.owner_is_dead(cp.lease_owner):
        return None
    return "leased"


def step_claim(run: Any, step: StepDef, seq: int, seen: Any) -> Claim | None:
    """Commit IN_PROGRESS with attempt + 1 and a fresh lease, or return None if we lost.

    `seen` is the checkpoint as read just before (None if absent); the write is fenced on its
    status and attempt count, so exactly one of any number of racing workers wins.
    """
    now = timezone.now()
    if claim_blocker(seen, now) is not None:
        return None
    expires = _lease_expiry(now)
    owner = leases.current_owner()
    attempt = seen.attempts + 1 if seen is not None else 1
    first_started = seen.first_started_at if seen is not None else now
    lease = {
        "status": StepStatus.IN_PROGRESS,
        "attempts": attempt,
        "lease_owner": owner,
        "lease_expires_at": expires,
        "started_at": now,
        "error": "",
    }
    try:
        won = sql.move_run_and_step(
            run_id=run.id,
            seq=seq,
            active=_ACTIVE,
            run_changes={"status": RunStatus.RUNNING, "wake_at": expires, "updated_at": now},
            **_step_write(run.id, step, seq, seen, lease, first_started_at=now),
        )
    except IntegrityError:
        return None  # another worker inserted the checkpoint first
    if not won:
        return None
    return Claim(
        attempt=attempt,
        outcome_unknown=seen is not None and seen.status == StepStatus.IN_PROGRESS,
        first_started_at=first_started,
    )


def lease_renew(run_id: str, seq: int, attempt: int) -> bool:
    """Extend our lease; False when another worker has taken the step over."""
    now = timezone.now()
    expires = _lease_expiry(now)
    with transaction.atomic():
        kept = sql.update(
            sql.STEPS,
            {"lease_expires_at": expires},
            "run_id = %s AND seq = %s AND status = %s AND attempts = %s",
            [run_id, seq, StepStatus.IN_PROGRESS, attempt],
        )
        if kept:
            changes = {"wake_at": expires, "updated_at": now}
            sql.update(sql.RUNS, changes, _RUN_AT_STEP, [run_id, seq, *_ACTIVE])
    return bool(kept)


# --- completion ---------------------------------------------------------------------------------
def step_complete(
    run: Any, workflow: Workflow, step: StepDef, seq: int, attempt: int, output: Any
) -> bool:
    """One commit: COMPLETED + output, fenced on our attempt (a worker whose lease was taken
    over changes nothing), and the run advances."""
    now = timezone.now()
    changes, next_seq = _advance(run, workflow, step, seq, output, now)
    done = sql.move_run_and_step(
        run_id=run.id,
        seq=seq,
        active=_ACTIVE,
        run_changes=changes,
        step_fence=(StepStatus.IN_PROGRESS, attempt),
        step_changes={
            "status": StepStatus.COMPLETED,
            "output": output,
            "finished_at": now,
            "lease_expires_at": None,
            "lease_owner": "",
        },
    )
    if done:
        hint = _fresh(workflow, changes)
        transaction.on_commit(partial(_after_complete, run.id, step.name, attempt, next_seq, hint))
        if next_seq is None:
            telemetry.run_finished(run.id, workflow.name, changes["status"])
    return done


def unclaimed_complete(
    run: Any, workflow: Workflow, step: StepDef, seq: int, seen: Any, output: Any
) -> bool:
    """Record a `read` or `db` step as COMPLETED without a prior claim: its one commit (or, for
    a `db` step, part of the caller's transaction).

    Returns False if a fence failed; raises IntegrityError if another worker inserted the
    checkpoint first.
    """
    now = timezone.now()
    attempt = seen.attempts + 1 if seen is not None else 1
    changes, next_seq = _advance(run, workflow, step, seq, output, now)
    done = sql.move_run_and_step(
        run_id=run.id,
        seq=seq,
        active=_ACTIVE,
        run_changes=changes,
        **_step_write(
            run.id,
            step,
            seq,
            seen,
            {
                "status": StepStatus.COMPLETED,
                "attempts": attempt,
                "output": output,
                "error": "",
                "started_at": now,
                "finished_at": now,
                "lease_expires_at": None,
                "lease_owner": "",
            },
            first_started_at=now,
        ),
    )
    if done:
        hint = _fresh(workflow, changes)
        transaction.on_commit(partial(_after_complete, run.id, step.name, attempt, next_seq, hint))
        if next_seq is None:
            telemetry.run_finished(run.id, workflow.name, changes["status"])
    return done


def _step_write(
    run_id: str,
    step: StepDef,
    seq: int,
    seen: Any,
    changes: dict[str, Any],
    *,
    first_started_at: datetime,
) -> dict[str, Any]:
    """Insert the checkpoint if none was seen, else update it fenced on what was seen."""
    if seen is None:
        return {
            "step_insert": {
                "retryable": False,
                "error": "",
                **changes,
                "run_id": run_id,
                "seq": seq,
                "name": step.name,
                "kind": step.kind,
                "idempotency_key": idempotency_key(run_id, seq),
                "first_started_at": first_started_at,
            }
        }
    return {"step_fence": (seen.status, seen.attempts), "step_changes": changes}


def _advance(
    run: Any, workflow: Workflow, step: StepDef, seq: int, output: Any, now: datetime
) -> tuple[dict[str, Any], int | None]:
    """The run's changes when it moves past `seq`, and the next seq to publish (if any)."""
    changes: dict[str, Any] = {"current_seq": seq + 1, "updated_at": now}
    if step.compensation_only:
        remaining = list(run.compensations)
        next_step = remaining.pop(0) if remaining else None
        changes["compensations"] = remaining
        if next_step is None:
            changes.update(status=RunStatus.FAILED, wake_at=None)
    else:
        next_step = workflow.next_step(step.name, output)
        if next_step is None:
            changes.update(status=RunStatus.COMPLETED, output=output, wake_at=None)
    if next_step is None:
        return changes, None
    grace = enqueue_grace()
    wake_at = sql.KeepIfLater(threshold=now + grace / 2, value=now + grace)
    changes.update(status=RunStatus.RUNNING, current_step=next_step, wake_at=wake_at)
    return changes, seq + 1


def _fresh(workflow: Workflow, changes: dict[str, Any]) -> dispatch.Fresh | None:
    next_step = changes.get("current_step")
    return dispatch.fresh_hint(workflow, next_step) if next_step is not None else None


def _after_complete(
    run_id: str, step_name: str, attempt: int, next_seq: int | None, fresh: dispatch.Fresh | None
) -> None:
    faults.crash_point(step_name, "after_complete", attempt)
    if next_seq is not None:
        dispatch.send_step(run_id, next_seq, fresh=fresh)
