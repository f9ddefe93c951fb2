"""Parallel read-only tool calls (`agentflow.agent.steps`): begin a batch, record a member (its
result, or what its failure means: a retry, a wait for a partner's turn, a failure, a park),
join when all are recorded. The only writer of a batch's rows.

A batch begins with one compare-and-set on the run (still at its first position, between
calls, as the task that found the batch read it), and its members' messages are published
only once that commits. Each member's record takes the run's row lock first, so two members
finishing at once are serialised: the second to commit counts the first's row, and exactly one
of them sees every member recorded and moves the run past the batch (another compare-and-set:
still at the batch, still this batch). A duplicate delivery of a member already recorded finds
its row and writes nothing; a member that was never recorded (its worker died, its message was
lost) is published again when the batch stalls: the sweeper rings for the run at the batch's
first position, whose task publishes every member not yet recorded. A member still running
keeps the run's wake-up time pushed on (`batch_keep_alive`, as a claimed step's lease renewal
does), so "stalled" means no member is running any more, never only "slower than a lease".

While a batch runs, the run's `current_seq` is its first position and `batch_last` its last;
every write of a member is fenced on both. `current_step` says it in words for people
(`batch_text`), and nothing reads it back.
"""

from __future__ import annotations

import logging
from datetime import datetime
from functools import partial
from typing import Any

from django.db import transaction

from agentflow._base.context import idempotency_key
from agentflow._base.states import RunStatus, StepStatus
from agentflow._conf import settings
from agentflow._core import builds, dispatch, faults
from agentflow._core.registry import NEXT_CALL, StepDef, Workflow
from agentflow._store import sql
from agentflow._store.events import event_add
from agentflow._store.runs import Fenced, begin_undo, enqueue_grace
from agentflow._store.sensitive import masked
from agentflow._store.steps import ACTIVE, CheckpointRow, StepState, state_load
from agentflow.models import RunEvent

logger = logging.getLogger("agentflow.store.batches")  # the name hosts' LOGGING knows

#: The kind of routing hold a wait for a partner's turn is (`WorkflowRun.hold`:
#: `partner:<key>`, `agentflow._builds.routing`): a member's wait here writes it, as a step's
#: wait does in partner limits' own store (`agentflow._limits.store`), which takes it from here,
#: the store being below it.
PARTNER_HOLD = "partner"


def batch_text(first: int, last: int) -> str:
    """The run's `current_step` while positions `first`..`last` run at once: for people."""
    return f"(calls {first}-{last} at once)"


def batch_started() -> datetime:
    """The database's now: when a member began, so the timeline shows members overlapping by
    one clock."""
    return sql.db_now()


def batch_begin(run: StepState, first: int, last: int) -> bool:
    """Positions `first`..`last` run at once: mark the run, and once that commits publish a
    message for each but the first, which the caller runs. False when the run moved (a
    duplicate began it first, a cancel, a fork): then nothing is published here."""
    with transaction.atomic():
        changes = {
            "current_step": batch_text(first, last),
            "batch_last": last,
            "updated_at": sql.at_now(),
            "wake_at": sql.at_now_plus(enqueue_grace().total_seconds()),
        }
        fence = (
            f"id = %s AND current_seq = %s AND current_step = %s AND branch = %s "
            f"AND cancel_requested = %s AND status IN ({sql.placeholders(ACTIVE)})"
        )
        params = [run.id, first, run.current_step, run.branch, run.cancel_requested, *ACTIVE]
        if not sql.update(sql.RUNS, changes, fence, params):
            return False
        for seq in range(first + 1, last + 1):  # the caller runs the first
            dispatch.send_step_on_commit(run.id, seq)
    return True


def batch_keep_alive(run_id: str, first: int, last: int, *, conn: Any = None) -> bool:
    """A member of batch `first`..`last` is still running: push the run's wake-up time one
    lease on, so the sweeper does not ring for a batch that is only slow (its doorbell would
    run the member a second time). False once the run has left the batch.

    `conn`: the process's liveness connection (psycopg, autocommit), as `lease_renew` takes it;
    without it, this thread's Django connection."""
    lease = float(settings.AGENTFLOW_LEASE_SECONDS)
    params = [run_id, first, last, *ACTIVE]
    if conn is None:
        where = (
            f"id = %s AND current_seq = %s AND batch_last = %s "
            f"AND status IN ({sql.placeholders(ACTIVE)})"
        )
        changes = {"wake_at": sql.at_now_plus(lease), "updated_at": sql.at_now()}
        return bool(sql.update(sql.RUNS, changes, where, params))
    with conn.cursor() as cur:
        cur.execute(_KEEP_ALIVE_STATEMENT, [lease, *params])
        return cur.rowcount == 1


_KEEP_ALIVE_STATEMENT = f"""
    UPDATE {sql.RUNS} SET wake_at = now() + %s * interval '1 second', updated_at = now()
    WHERE id = %s AND current_seq = %s AND batch_last = %s
      AND status IN ({", ".join(["%s"] * len(ACTIVE))})
"""


def batch_missing(run_id: str, first: int, last: int) -> list[int]:
    """The batch's positions not recorded COMPLETED yet."""
    done = {
        row[0]
        for row in sql.fetch_all(
            f"SELECT seq FROM {sql.STEPS} WHERE run_id = %s AND seq BETWEEN %s AND %s "
            "AND status = %s",
            [run_id, first, last, StepStatus.COMPLETED],
        )
    }
    return [seq for seq in range(first, last + 1) if seq not in done]


def batch_republish(run_id: str, first: int, last: int, *, but: int | None = None) -> None:
    """Publish again the members of a stalled batch that are not recorded (each is harmless
    twice: a recorded member writes nothing)."""
    for seq in batch_missing(run_id, first, last):
        if seq != but:
            logger.info(
                "%s batch %d-%d: position %d is published again (not recorded)",
                run_id,
                first,
                last,
                seq,
            )
            dispatch.send_step(run_id, seq)


def batch_record(
    run: StepState,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    seen: CheckpointRow | None,
    output: Any,
    *,
    started_at: datetime,
    attempt: int,
) -> bool:
    """Record member `seq` COMPLETED, and if it was the last of its batch to be, move the run
    past the batch (publishing the next call once that commits). False, writing nothing, when
    the run is no longer at this batch (fenced) or the member was recorded already."""
    span = run.batch
    assert span is not None
    first, last = span
    with transaction.atomic():
        locked = _pending(run, seq)
        if locked is None:
            return False
        now_seen = locked.checkpoint
        changes = {
            "status": StepStatus.COMPLETED,
            "attempts": attempt,
            "output": output,
            "error": "",
            "retryable": False,
            "started_at": started_at,
            "finished_at": sql.at_now(),
            "retry_at": None,
        }
        _write(run.id, step, seq, now_seen, changes)
        joined = not batch_missing(run.id, first, last)
        if joined:
            _join(run, first, last)
    transaction.on_commit(
        partial(_after_record, run.id, step.name, attempt, last + 1 if joined else None)
    )
    return True


def batch_fail(
    run: StepState,
    workflow: Workflow,
    step: StepDef,
    seq: int,
    seen: CheckpointRow | None,
    error: str,
    *,
    started_at: datetime,
    attempt: int,
    retry_in_seconds: float | None,
) -> bool:
    """Member `seq` failed: with `retry_in_seconds`, recorded FAILED (retryable) and published
    again after it; else the run fails past the whole batch (its compensations after `last`,
    never at a member's position). False when fenced."""
    span = run.batch
    assert span is not None
    first, last = span
    with transaction.atomic():
        locked = _pending(run, seq)
        if locked is None:
            return False
        now_seen = locked.checkpoint
        changes = {
            "status": StepStatus.FAILED,
            "attempts": attempt,
            "error": error,
            "retryable": retry_in_seconds is not None,
            "started_at": started_at,
            "finished_at": sql.at_now(),
            "retry_at": None,
        }
        _write(run.id, step, seq, now_seen, changes)
        if retry_in_seconds is not None:
            dispatch.send_step_on_commit(
                run.id,
                seq,
                countdown=retry_in_seconds,
                fresh=dispatch.member_hint(workflow, run.current_step),
            )
            return True
        # Failing from the batch's last position: compensations start after every member.
        moved = sql.update(
            sql.RUNS,
            {"current_seq": last},
            "id = %s AND current_seq = %s AND batch_last = %s",
            [run.id, first, last],
        )
        if not moved:
            raise Fenced
        locked.current_seq = last
        begin_undo(locked, workflow, seq=last, reason=f"{step.name}: {error}")
    return True


def batch_park(
    run: StepState,
    seq: int,
    reason: str,
    *,
    kind: str = RunEvent.Kind.NEEDS_ATTENTION,
    data: dict[str, Any] | None = None,
) -> bool:
    """Member `seq` asks for a person (docs/protocol.md, "What a failure means"): the run stops
    NEEDS_ATTENTION with `reason`, still at its batch (`current_seq` the first position,
    `batch_last` kept), and an event of `kind` at the member's position. The member writes no
    checkpoint, as a read step that parks writes none; its siblings' records are fenced out
    meanwhile. An operator's retry publishes the batch's first position, whose task publishes
    every member not recorded. False when fenced."""
    span = run.batch
    assert span is not None
    first, last = span
    with transaction.atomic():
        if _pending(run, seq) is None:
            return False
        changes = {
            "status": RunStatus.NEEDS_ATTENTION,
            "error": reason,
            "wake_at": None,
            "updated_at": sql.at_now(),
        }
        moved = sql.update(
            sql.RUNS,
            changes,
            "id = %s AND current_seq = %s AND batch_last = %s",
            [run.id, first, last],
        )
        if not moved:
            raise Fenced
        event_add(run.id, kind, reason, seq=seq, data=data)
    logger.warning("run %s needs attention: %s", run.id, masked(run.id, reason))
    return True


def batch_wait_turn(
    run: StepState,
    workflow: Workflow,
    seq: int,
    seen: CheckpointRow | None,
    *,
    partner: str,
    why: str,
    seconds: float,
) -> bool:
    """Member `seq` got no turn at `partner` (docs/partner-limits.md, "What happens"): it waits
    `seconds` and runs again, no attempt spent; its siblings go on and the batch joins once it too
    is recorded. The run stays as it is (its other members run, RUNNING) but holds the reason as a
    step's wait does (`hold` `partner:<key>`, the held event the run page reads) until the member
    goes (`batch_member_goes`) or the batch joins; a sibling's record leaves it. The member's
    message is a countdown marked as its own (`dispatch.member_hint`: no doorbell for the
    batch), and the run's wake-up time is put at least that far on so the sweeper rings for
    the batch only after it (a lost message costs latency, never the run). False when fenced."""
    seconds = max(float(seconds), 0.0)
    span = run.batch
    assert span is not None
    first, last = span
    hold = f"{PARTNER_HOLD}:{partner}"
    with transaction.atomic():
        locked = _pending(run, seq)
        if locked is None:
            return False
        now_seen = locked.checkpoint
        if now_seen is not None and now_seen.status == StepStatus.FAILED:
            sql.update(
                sql.STEPS,
                {"retry_at": None, "error": why[:4000]},
                "run_id = %s AND seq = %s AND fence = %s AND status = %s",
                [run.id, seq, now_seen.fence, StepStatus.FAILED],
            )
        countdown = min(seconds, dispatch.MAX_COUNTDOWN_SECONDS)
        sql.update(
            sql.RUNS,
            {
                "wake_at": sql.keep_if_later(
                    "wake_at", threshold_seconds=countdown, seconds=countdown
                ),
                "updated_at": sql.at_now(),
                "hold": hold,
            },
            "id = %s",
            [run.id],
        )
        if _last_held(run.id, first, last) != (seq, why):
            event_add(run.id, RunEvent.Kind.HELD, why, seq=seq, data={"hold": hold})
        dispatch.send_step_on_commit(
            run.id,
            seq,
            countdown=countdown or None,
            fresh=dispatch.member_hint(workflow, run.current_step),
        )
    return True


def batch_member_goes(run: StepState, seq: int) -> None:
    """Member `seq`, which waited for a turn, runs now: the run holds its reason no more,
    unless a sibling began waiting since (the batch's last held event is then the sibling's)."""
    span = run.batch
    assert span is not None
    first, last = span
    with transaction.atomic():
        if _locked(run, seq) is None:
            return
        held = _last_held(run.id, first, last)
        if held is not None and held[0] == seq:
            sql.update(
                sql.RUNS,
                {"hold": "", "updated_at": sql.at_now()},
                "id = %s AND current_seq = %s AND batch_last = %s",
                [run.id, first, last],
            )


def _last_held(run_id: str, first: int, last: int) -> tuple[int, str] | None:
    """The batch's last held event: the member's position and the reason it gave."""
    row = sql.fetch_one(
        f"SELECT seq, detail FROM {sql.EVENTS} WHERE run_id = %s AND kind = %s "
        "AND seq BETWEEN %s AND %s ORDER BY id DESC LIMIT 1",
        [run_id, RunEvent.Kind.HELD, first, last],
    )
    return (int(row[0]), row[1]) if row is not None else None


def _pending(run: StepState, seq: int) -> StepState | None:
    """`_locked`, while member `seq` is not recorded COMPLETED: a member recorded once (a
    duplicate delivery finds it so) is never written again."""
    locked = _locked(run, seq)
    if locked is None:
        return None
    seen = locked.checkpoint
    if seen is not None and seen.status == StepStatus.COMPLETED:
        return None
    return locked


def _locked(run: StepState, seq: int) -> StepState | None:
    """The run under its row lock, with its checkpoint at `seq`, if still at the same batch
    as decided (between calls of the same branch, not cancelled since)."""
    locked = state_load(run.id, seq, lock=True)
    if (
        locked is None
        or locked.status not in ACTIVE
        or locked.current_seq != run.current_seq
        or locked.batch_last != run.batch_last
        or locked.branch != run.branch
        or locked.cancel_requested != run.cancel_requested
    ):
        return None
    return locked


def _write(
    run_id: str, step: StepDef, seq: int, seen: CheckpointRow | None, changes: dict[str, Any]
) -> None:
    """Insert the member's checkpoint, or update the one a failed attempt left (fenced on its
    fence; the run's row lock already keeps every other member writer out), naming the build
    whose code ran it, as every other checkpoint does (docs/deploys.md, "Builds")."""
    changes = {**changes, "build": builds.current()}
    if seen is None:
        sql.insert(
            sql.STEPS,
            {
                **changes,
                "run_id": run_id,
                "seq": seq,
                "name": step.name,
                "kind": step.kind,
                "fence": sql.first_fence(run_id),
                "idempotency_key": step.key or idempotency_key(run_id, seq),
                "arguments": step.arguments,
                "digest": step.digest,
                "first_started_at": changes["started_at"],
                "lease_owner": "",
            },
        )
        return
    where = "run_id = %s AND seq = %s AND fence = %s AND status <> %s"
    params = [run_id, seq, seen.fence, StepStatus.COMPLETED]
    if not sql.update(sql.STEPS, {**changes, "fence": seen.fence + 1}, where, params):
        raise Fenced


def _join(run: StepState, first: int, last: int) -> None:
    """Every member is recorded: the run goes on after the batch, between calls."""
    grace = settings.AGENTFLOW_LEASE_SECONDS
    changes = {
        "current_seq": last + 1,
        "current_step": NEXT_CALL,
        "batch_last": None,
        "status": RunStatus.RUNNING,
        "hold": "",  # a member's partner wait, if it held the reason, is over
        "updated_at": sql.at_now(),
        "wake_at": sql.keep_if_near("wake_at", threshold_seconds=grace / 2, seconds=grace),
    }
    moved = sql.update(
        sql.RUNS,
        changes,
        "id = %s AND current_seq = %s AND batch_last = %s",
        [run.id, first, last],
    )
    if not moved:
        raise Fenced


def _after_record(run_id: str, step_name: str, attempt: int, next_seq: int | None) -> None:
    faults.crash_point(step_name, "after_complete", attempt)
    if next_seq is not None:
        dispatch.send_step(run_id, next_seq)
