"""The step hot path: load, claim, renew, complete, advance. Raw SQL, one commit each.

A `read` step costs one commit (completion and advance together), an `effect` step two (the
claim, folded into the load, before the call; the fenced completion after). Every write is a
compare-and-set whose
row count decides who won, and is fenced on the checkpoint's fence number, which every write
but a lease renewal increments and nothing ever resets (a checkpoint written after a fork
starts above those it set aside): a worker whose claim was taken over, retried, cancelled or
forked past cannot change anything (I5), however long it slept.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.db import IntegrityError, transaction

from agentflow._base.context import idempotency_key
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus, StepKind, StepStatus
from agentflow._conf import settings
from agentflow._core import builds, dispatch, faults, leases
from agentflow._core.registry import StepDef, Workflow
from agentflow._observe import telemetry
from agentflow._store import sql
from agentflow._store.concurrency import concurrency_run_ended
from agentflow._store.events import event_add, event_time
from agentflow._store.parents import run_ended
from agentflow.models import RunEvent

ACTIVE: list[str] = [str(status) for status in ACTIVE_RUN_STATUSES]


@dataclass(slots=True, kw_only=True)
class CheckpointRow:
    """A checkpoint as loaded, with what the database's clock says about it."""

    id: int
    name: str
    kind: str
    status: str
    attempts: int
    fence: int
    retryable: bool
    lease_owner: str
    #: May it be claimed now (database clock): see `sql.claimable`.
    claimable: bool
    #: Its lease has run out (database clock); with `claimable`, the other reason is a lost owner.
    lease_expired: bool
    first_started_at: datetime
    started_at: datetime | None
    lease_expires_at: datetime | None
    #: Seconds since the first attempt began (database clock): the key-age guard's measure.
    key_age_seconds: float


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
    cancel_requested: bool
    #: Agent runs: the branch new calls name in their keys (0 until an operator forks).
    branch: int
    #: Past its wake-up time (database clock): nothing has moved it for too long.
    overdue: bool
    checkpoint: CheckpointRow | None
    #: The build whose code runs it (docs/deploys.md, "Builds"); pinned to it; what holds it (see
    #: the model).
    build: str = ""
    pinned: bool = False
    hold: str = ""
    #: Put on each of its step messages (agentflow._priority); its concurrency key's digest.
    priority: int | None = None
    concurrency_key: str = ""
    #: Started by another run (`store.parents` rings that run when this one ends).
    child: bool = False
    #: Agent runs: the last position of the calls running at once from `current_seq` on
    #: (`agentflow.agent.steps`); None when no batch runs.
    batch_last: int | None = None

    @property
    def batch(self) -> tuple[int, int] | None:
        """(first, last) of the calls running at once, or None."""
        return None if self.batch_last is None else (self.current_seq, self.batch_last)


_STATE_COLUMNS = f"""
    r.workflow, r.version, r.input, r.status, r.current_step, r.current_seq, r.compensations,
    r.error, r.cancel_requested, COALESCE(r.wake_at <= {sql.now()}, false),
    c.id, c.name, c.status, c.attempts, c.fence, c.retryable, c.lease_owner,
    CASE WHEN c.id IS NULL THEN false ELSE {sql.claimable("c")} END,
    COALESCE(c.lease_expires_at <= {sql.now()}, false),
    c.first_started_at, c.started_at, c.lease_expires_at, {sql.seconds_since("c.first_started_at")},
    r.branch, c.kind, r.build, r.pinned, r.hold, r.priority, r.concurrency_key,
    r.parent_id IS NOT NULL, r.batch_last
"""
_STATE_FROM = f"""
    FROM {sql.RUNS} r
    LEFT JOIN {sql.STEPS} c ON c.run_id = r.id AND c.seq = %s
    WHERE r.id = %s
"""
_STATE_WIDTH = 32


def state_load(run_id: str, seq: int, *, lock: bool = False) -> StepState | None:
    """The run and its checkpoint at `seq`. With `lock`, the run row stays locked until the
    caller's transaction ends (a `db` step holds it while its writes happen)."""
    query = f"SELECT {_STATE_COLUMNS} {_STATE_FROM}"
    if lock and sql.postgres():
        query += " FOR UPDATE OF r"  # SQLite needs none: IMMEDIATE transactions serialise
    return _state_from_row(run_id, sql.fetch_one(query, [seq, run_id]))


def _state_from_row(run_id: str, row: tuple[Any, ...] | None) -> StepState | None:
    if row is None:
        return None
    checkpoint = None
    if row[10] is not None:
        checkpoint = CheckpointRow(
            id=row[10],
            name=row[11],
            kind=row[24],
            status=row[12],
            attempts=row[13],
            fence=row[14],
            retryable=bool(row[15]),
            lease_owner=row[16],
            claimable=bool(row[17]),
            lease_expired=bool(row[18]),
            first_started_at=sql.read_datetime(row[19]),  # type: ignore[arg-type]
            started_at=sql.read_datetime(row[20]),
            lease_expires_at=sql.read_datetime(row[21]),
            key_age_seconds=float(row[22] or 0.0),
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
        cancel_requested=bool(row[8]),
        branch=int(row[23] or 0),
        overdue=bool(row[9]),
        checkpoint=checkpoint,
        build=row[25],
        pinned=bool(row[26]),
        hold=row[27],
        priority=row[28],
        concurrency_key=row[29],
        child=bool(row[30]),
        batch_last=row[31],
    )


def _lease_seconds() -> float:
    return float(settings.AGENTFLOW_LEASE_SECONDS)


# --- claims -------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Claim:
    attempt: int
    #: This claim's fence: every later write of this attempt is fenced on it.
    fence: int
    #: The step was IN_PROGRESS under a lost owner: its effect may or may not have happened.
    outcome_unknown: bool
    first_started_at: datetime
    started_at: datetime
    #: Seconds since the first attempt began, when this claim was made (database clock).
    key_age_seconds: float


#: Claims the step at `seq` when it is still fresh (run PENDING or RUNNING at that seq and step,
#: on the expected definition, not cancelling, no checkpoint), then reads the state as it was
#: before the claim: the sub-statements of one statement share a snapshot. A racing claimer makes
#: the INSERT fail on unique (run, seq), so the whole statement changes nothing.
def _load_and_claim_query() -> str:
    return f"""
    WITH claimed_run AS (
        UPDATE {sql.RUNS} r SET status = %s, wake_at = {sql.now_plus()}, updated_at = {sql.now()}
        WHERE r.id = %s AND r.current_seq = %s AND r.status IN (%s, %s) AND NOT r.cancel_requested
          AND r.workflow = %s AND r.version = %s AND r.current_step = %s AND r.build = %s
          AND NOT EXISTS (SELECT 1 FROM {sql.STEPS} c WHERE c.run_id = r.id AND c.seq = %s)
        RETURNING r.id, r.fence_floor
    ), claimed AS (
        INSERT INTO {sql.STEPS} (run_id, seq, name, kind, idempotency_key, status, attempts, fence,
                                 retryable, error, lease_owner, lease_lock, lease_server,
                                 lease_expires_at, started_at, first_started_at, build)
        SELECT id, %s, %s, %s, %s, %s, 1, fence_floor + 1, false, '', %s, %s, %s,
               {sql.now_plus()}, {sql.now()}, {sql.now()}, %s
        FROM claimed_run
        RETURNING id, started_at, fence
    )
    SELECT {_STATE_COLUMNS}, (SELECT started_at FROM claimed), (SELECT fence FROM claimed)
    {_STATE_FROM}
    """


def state_load_claiming(
    run_id: str, seq: int, workflow: Workflow, step: StepDef
) -> tuple[StepState | None, Claim | None]:
    """`state_load`, and the claim of `step` (an effect or llm step of `workflow`) in the same
    statement when the run has just been moved onto it: one round trip fewer for a fresh
    effect step. The claim is exactly the one `step_claim` would commit after the caller's
    checks, which hold by the statement's fences; in any other case (a checkpoint exists,
    another definition, a race) nothing is claimed and the caller decides as usual."""
    if not sql.postgres():
        return state_load(run_id, seq), None
    owner, lock, server = leases.current_owner()
    lease = _lease_seconds()
    build = builds.current()  # only a worker of the run's build claims (docs/deploys.md, "Builds")
    params = [
        RunStatus.RUNNING,
        lease,
        run_id,
        seq,
        RunStatus.PENDING,
        RunStatus.RUNNING,
        workflow.name,
        workflow.version,
        step.name,
        build,
        seq,
        seq,
        step.name,
        step.kind,
        idempotency_key(run_id, seq),
        StepStatus.IN_PROGRESS,
        owner,
        lock,
        server,
        lease,
        build,
        seq,
        run_id,
    ]
    try:
        row = sql.fetch_one(_load_and_claim_query(), params)
    except IntegrityError:
        return state_load(run_id, seq), None  # another worker claimed it first
    state = _state_from_row(run_id, row)
    if row is None or row[_STATE_WIDTH] is None:
        return state, None
    started = sql.read_datetime(row[_STATE_WIDTH])
    assert started is not None
    claim = Claim(
        attempt=1,
        fence=int(row[_STATE_WIDTH + 1]),
        outcome_unknown=False,
        first_started_at=started,
        started_at=started,
        key_age_seconds=0.0,
    )
    return state, claim


def claim_blocker(cp: CheckpointRow | None) -> str | None:
    """Why checkpoint `cp` cannot be claimed now, or None when it can
    (docs/protocol.md, "One step, in order", step 4)."""
    if cp is None or cp.claimable:
        return None
    if cp.status == StepStatus.COMPLETED:
        return "completed"
    if cp.status == StepStatus.FAILED:
        return "not due" if cp.retryable else "failed"
    return "leased"


def step_claim(run: StepState, step: StepDef, seq: int, seen: CheckpointRow | None) -> Claim | None:
    """Commit IN_PROGRESS with attempt + 1, the next fence and a fresh lease, or return None if
    we lost.

    `seen` is the checkpoint as read just before (None if absent). The write is fenced on its
    fence number, and whether it is claimable is decided again by the database at the moment of
    the write, so exactly one of any number of racing workers wins, and a lease renewed since
    `seen` was read is never taken. Taking over a lost owner's step is recorded as an event.
    """
    if claim_blocker(seen) is not None:
        return None
    owner, lock, server = leases.current_owner()
    attempt = seen.attempts + 1 if seen is not None else 1
    lease = {
        "status": StepStatus.IN_PROGRESS,
        "attempts": attempt,
        "fence": seen.fence + 1 if seen is not None else sql.first_fence(run.id),
        "lease_owner": owner,
        "lease_lock": lock,
        "lease_server": server,
        "lease_expires_at": sql.at_now_plus(_lease_seconds()),
        "started_at": sql.at_now(),
        "finished_at": None,
        "retry_at": None,
        "error": "",
        "build": builds.current(),
    }
    takeover = seen is not None and seen.status == StepStatus.IN_PROGRESS
    try:
        with transaction.atomic() if takeover else _no_transaction():
            row = sql.move_run_and_step(
                run_id=run.id,
                seq=seq,
                active=ACTIVE,
                run_changes={
                    "status": RunStatus.RUNNING,
                    "wake_at": sql.at_now_plus(_lease_seconds()),
                    "updated_at": sql.at_now(),
                    # Its step runs: whatever held it (a partner's turn) holds it no more.
                    **({"hold": ""} if run.hold else {}),
                },
                **_step_write(run.id, step, seq, seen, lease, claimable=True),
                run_expected=_as_decided(run),
                returning=(
                    "started_at",
                    "first_started_at",
                    sql.seconds_since("first_started_at"),
                    "fence",
                ),
            )
            if row is None:
                return None
            started, fence = sql.read_datetime(row[0]), int(row[3])
            if takeover:
                assert seen is not None
                _record_takeover(run.id, seq, seen, attempt, fence, started)
    except IntegrityError:
        return None  # another worker inserted the checkpoint first
    assert started is not None
    return Claim(
        attempt=attempt,
        fence=fence,
        outcome_unknown=takeover,
        first_started_at=sql.read_datetime(row[1]),  # type: ignore[arg-type]
        started_at=started,
        key_age_seconds=float(row[2] or 0.0),
    )


class _no_transaction:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


def _record_takeover(
    run_id: str,
    seq: int,
    seen: CheckpointRow,
    attempt: int,
    fence: int,
    at: datetime | None,
) -> None:
    reason = "lease_expired" if seen.lease_expired else "owner_gone"
    if not seen.lease_owner:
        reason = "operator"  # released by an operator's retry
    event_add(
        run_id,
        RunEvent.Kind.TAKEOVER,
        f"attempt {attempt} took over from {seen.lease_owner or 'a released claim'} "
        f"({reason.replace('_', ' ')})",
        seq=seq,
        data={
            "attempt": attempt,
            "fence": fence,
            "at": event_time(at),
            "reason": reason,
            "previous": {
                "attempt": seen.attempts,
                "fence": seen.fence,
                "owner": seen.lease_owner,
                "started_at": event_time(seen.started_at),
                "lease_expires_at": event_time(seen.lease_expires_at),
            },
        },
    )


def lease_renew(run_id: str, seq: int, fence: int, *, conn: Any = None) -> bool:
    """Extend our lease (and the run's wake-up time); False once our claim is fenced out.

    `conn`: the process's liveness connection (psycopg, autocommit), which renews leases from
    the renewer thread on Postgres; without it, this thread's Django connection.
    """
    lease = _lease_seconds()
    if conn is None:
        with transaction.atomic():
            kept = sql.update(
                sql.STEPS,
                {"lease_expires_at": sql.at_now_plus(lease)},
                "run_id = %s AND seq = %s AND status = %s AND fence = %s",
                [run_id, seq, StepStatus.IN_PROGRESS, fence],
            )
            if kept:
                sql.update(
                    sql.RUNS,
                    {"wake_at": sql.at_now_plus(lease), "updated_at": sql.at_now()},
                    f"id = %s AND current_seq = %s AND status IN ({sql.placeholders(ACTIVE)})",
                    [run_id, seq, *ACTIVE],
                )
        return bool(kept)
    with conn.cursor() as cur:
        cur.execute(_RENEW_ONE_STATEMENT, [lease, run_id, seq, fence, lease, *ACTIVE])
        return cur.rowcount == 1


_RENEW_ONE_STATEMENT = f"""
    WITH kept AS (
        UPDATE {sql.STEPS} SET lease_expires_at = now() + %s * interval '1 second'
        WHERE run_id = %s AND seq = %s AND status = 'IN_PROGRESS' AND fence = %s
        RETURNING run_id, seq
    )
    UPDATE {sql.RUNS} r SET wake_at = now() + %s * interval '1 second', updated_at = now()
    FROM kept WHERE r.id = kept.run_id AND r.current_seq = kept.seq
      AND r.status IN ({", ".join(["%s"] * len(ACTIVE))})
"""


# --- completion ---------------------------------------------------------------------------------
def step_complete(
    run: StepState,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    claim: Claim,
    output: Any,
) -> bool:
    """One commit: COMPLETED + output, fenced on our claim (a worker whose claim was taken over
    changes nothing), and the run advances. A fenced-out completion is kept as an event with its
    output, so what the partner did is never lost to audit."""
    changes, next_seq = _advance(run, workflow, step, seq, output)
    done = sql.move_run_and_step(
        run_id=run.id,
        seq=seq,
        active=ACTIVE,
        run_changes=changes,
        step_where=sql.StepWhere("{c}.status = 'IN_PROGRESS' AND {c}.fence = %s", (claim.fence,)),
        step_changes={
            "status": StepStatus.COMPLETED,
            "output": output,
            "fence": claim.fence + 1,
            "finished_at": sql.at_now(),
            "lease_expires_at": None,
            "lease_owner": "",
            "lease_lock": None,
        },
        # Its claim waited for the disk, and the next one's wait flushes this too; but nothing
        # of the run commits after the completion that ends it (sql.RELAXED_COMMIT).
        synchronous=next_seq is None,
    )
    if done is None:
        event_add(
            run.id,
            RunEvent.Kind.LATE_COMPLETION,
            f"{step.name} attempt {claim.attempt} finished after its claim was fenced out; "
            "its result was not recorded as the step's",
            seq=seq,
            data={"attempt": claim.attempt, "fence": claim.fence, "output": output},
        )
        return False
    hint = _fresh(workflow, changes)
    transaction.on_commit(partial(_after_complete, run, step.name, claim.attempt, next_seq, hint))
    if next_seq is None:
        telemetry.run_finished(run.id, workflow.name, changes["status"])
        _ended(run)
    return True


def unclaimed_complete(
    run: StepState,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    seen: CheckpointRow | None,
    output: Any,
) -> bool:
    """Record a `read` or `db` step as COMPLETED without a prior claim: its one commit (or, for
    a `db` step, part of the caller's transaction).

    Returns False if a fence failed; raises IntegrityError if another worker inserted the
    checkpoint first.
    """
    attempt = seen.attempts + 1 if seen is not None else 1
    changes, next_seq = _advance(run, workflow, step, seq, output)
    done = sql.move_run_and_step(
        run_id=run.id,
        seq=seq,
        active=ACTIVE,
        run_changes=changes,
        **_step_write(
            run.id,
            step,
            seq,
            seen,
            {
                "status": StepStatus.COMPLETED,
                "attempts": attempt,
                "fence": seen.fence + 1 if seen is not None else sql.first_fence(run.id),
                "output": output,
                "error": "",
                "started_at": sql.at_now(),
                "finished_at": sql.at_now(),
                "retry_at": None,
                "lease_expires_at": None,
                "lease_owner": "",
                "lease_lock": None,
                "build": builds.current(),
            },
            claimable=False,
        ),
        run_expected=_as_decided(run),
        # A read made no effect: lost in a server crash, it runs again (sql.RELAXED_COMMIT),
        # unless it ends the run. A db step's writes share the caller's transaction, which
        # keeps the wait.
        synchronous=step.kind == StepKind.DB or next_seq is None,
    )
    if done is not None:
        hint = _fresh(workflow, changes)
        transaction.on_commit(partial(_after_complete, run, step.name, attempt, next_seq, hint))
        if next_seq is None:
            telemetry.run_finished(run.id, workflow.name, changes["status"])
            _ended(run)
    return done is not None


def _ended(run: StepState) -> None:
    """The run's end is in this transaction: its parent's wait and its concurrency key's next
    runs hear of it once it commits. A run that has neither is none of their business."""
    if run.child:
        run_ended(run.id, child=True)
    if run.concurrency_key:
        concurrency_run_ended(run)


def _as_decided(run: StepState) -> dict[str, Any]:
    """What decided which step runs at the run's seq. A claim, and a read or db step's write,
    is fenced on all of it being unchanged, so a worker that loaded the run before an operator
    cancelled or forked it changes nothing after (I5): the fast path's claim checks the same."""
    return {
        "current_step": run.current_step,
        "cancel_requested": run.cancel_requested,
        "branch": run.branch,
        # The build is part of what decided: a worker of another build never claims or
        # completes anything of a run that moved (docs/deploys.md, "Builds", rollback).
        "build": run.build,
    }


def _step_write(
    run_id: str,
    step: StepDef,
    seq: int,
    seen: CheckpointRow | None,
    changes: dict[str, Any],
    *,
    claimable: bool,
) -> dict[str, Any]:
    """Insert the checkpoint if none was seen, else update it fenced on the fence seen (and,
    for a claim, on being claimable by the database's clock at the moment of the write)."""
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
                "idempotency_key": step.key or idempotency_key(run_id, seq),
                "arguments": step.arguments,
                "digest": step.digest,
                "first_started_at": sql.at_now(),
            }
        }
    where = "{c}.fence = %s"
    if claimable:
        where += " AND " + sql.claimable("{c}")
    return {"step_where": sql.StepWhere(where, (seen.fence,)), "step_changes": changes}


def _advance(
    run: Any, workflow: Workflow, step: StepDef, seq: int, output: Any
) -> tuple[dict[str, Any], int | None]:
    """The run's changes when it moves past `seq`, and the next seq to publish (if any)."""
    changes: dict[str, Any] = {"current_seq": seq + 1, "updated_at": sql.at_now()}
    if getattr(run, "hold", ""):
        changes["hold"] = ""  # a hold's reason ends once its step ran
    if step.compensation_only:
        remaining = list(run.compensations)
        next_step = remaining.pop(0) if remaining else None
        changes["compensations"] = remaining
        if next_step is None:
            ended = RunStatus.CANCELLED if run.cancel_requested else RunStatus.FAILED
            changes.update(status=ended, wake_at=None)
    else:
        next_step = workflow.next_step(step.name, output)
        if next_step is None:
            changes.update(status=RunStatus.COMPLETED, output=output, wake_at=None)
    if next_step is None:
        return changes, None
    grace = settings.AGENTFLOW_LEASE_SECONDS
    changes.update(
        status=RunStatus.RUNNING,
        current_step=next_step,
        wake_at=sql.keep_if_near("wake_at", threshold_seconds=grace / 2, seconds=grace),
    )
    return changes, seq + 1


def _fresh(workflow: Workflow, changes: dict[str, Any]) -> dispatch.Fresh | None:
    next_step = changes.get("current_step")
    return dispatch.fresh_hint(workflow, next_step) if next_step is not None else None


def _after_complete(
    run: StepState, step_name: str, attempt: int, next_seq: int | None, fresh: dispatch.Fresh | None
) -> None:
    faults.crash_point(step_name, "after_complete", attempt)
    if next_seq is not None:
        queue = builds.route(run.build, run.pinned)
        if queue is None:
            dispatch.send_step(run.id, next_seq, fresh=fresh, priority=run.priority)
        else:
            dispatch.send_step(run.id, next_seq, fresh=fresh, queue=queue, priority=run.priority)
