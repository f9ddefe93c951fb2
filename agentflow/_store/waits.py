"""Durable time and people (docs/workflows.md, "Timers, signals and approvals"): the wait at a run's
position, and the signal or the decision that ends it.

A wait is recorded the first time the run reaches its position (a timer's time, a timeout, the
exact call to approve and its digest), in the transaction that moves the run to WAITING; a
decision is recorded in the transaction that moves it back to RUNNING. A signal is kept from
the moment it arrives (`store.signals`), and a signal wait consumes the oldest kept one of its
name in the transaction that resolves the wait, whichever of the two came first: the wait's
recorded outcome is what every replay of its position reads, so a worker killed after that
commit and before the step's checkpoint takes nothing a second time. All of them take the
run's row lock first, as every operator action does (`store.operator`), so a signal, an
approval, a cancel, a retry and a fork of one run happen one after the other, and each finds
what the one before it left: the loser is refused, never half-applied (I5, I6).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from agentflow._base import outcomes
from agentflow._base.canonical import digest, normalise
from agentflow._base.context import Decision
from agentflow._base.states import RunStatus, WaitKind
from agentflow._conf import settings
from agentflow._core import dispatch
from agentflow._core.registry import WaitSpec
from agentflow._store import sql
from agentflow._store.events import event_add, event_time
from agentflow._store.operator import locked_run, wake_soon
from agentflow._store.runs import run_park
from agentflow._store.steps import ACTIVE, StepState, state_load
from agentflow.exceptions import ActionRefused
from agentflow.models import RunEvent, RunWait, WorkflowRun

#: A signal wait without a timeout still has a wake-up time (I7: no active run without one):
#: the sweeper looks at it once a day, finds it still waiting and lets it sleep again.
RECHECK_SECONDS = 24 * 3600.0


@dataclass(frozen=True, kw_only=True)
class OpenWait:
    """A wait as loaded, with what the database's clock says about its deadline."""

    id: int
    kind: str
    name: str
    arguments: Any
    digest: str
    requested_at: datetime
    deadline: datetime | None
    outcome: Any
    #: Its deadline has passed (database clock).
    due: bool
    #: Seconds until the deadline (database clock), None without one.
    remaining_seconds: float | None


_WAIT_COLUMNS = f"""id, kind, name, arguments, digest, requested_at, deadline, outcome,
    COALESCE(deadline <= {sql.now()}, false), -{sql.seconds_since("deadline")}"""


def wait_at(run_id: str, branch: int, seq: int) -> OpenWait | None:
    row = sql.fetch_one(
        f"SELECT {_WAIT_COLUMNS} FROM {sql.WAITS} WHERE run_id = %s AND branch = %s AND seq = %s",
        [run_id, branch, seq],
    )
    if row is None:
        return None
    return OpenWait(
        id=row[0],
        kind=row[1],
        name=row[2],
        arguments=sql.read_json(row[3]),
        digest=row[4],
        requested_at=sql.read_datetime(row[5]),  # type: ignore[arg-type]
        deadline=sql.read_datetime(row[6]),
        outcome=sql.read_json(row[7]),
        due=bool(row[8]),
        remaining_seconds=float(row[9]) if row[9] is not None else None,
    )


def call_digest(name: str, arguments: Any) -> str:
    """What a decision is bound to: SHA-256 of the canonical (call name, arguments)."""
    return digest([name, normalise(arguments)])


# --- the worker's side: reach the wait, or find it over -----------------------------------------
def wait_settle(run: StepState, spec: WaitSpec, seq: int) -> Any | None:
    """The wait of the step at `seq` as the run reaches it: its outcome once it is over (a
    timer's time passed, a signal delivered, a decision recorded, a timeout), else None — the
    run is then WAITING until the deadline (or the signal or decision that wakes it), or it
    moved on under us (a cancel, a fork), and there is nothing to do.

    Fenced like a claim: on the run being active at `seq` as `run_step` found it when it chose
    this step (step, cancel flag, branch), under the run's row lock.
    """
    with transaction.atomic():
        locked = state_load(run.id, seq, lock=True)
        if (
            locked is None
            or locked.status not in ACTIVE
            or locked.current_seq != seq
            or locked.current_step != run.current_step
            or locked.cancel_requested != run.cancel_requested
            or locked.branch != run.branch
        ):
            return None
        wanted = call_digest(spec.name, spec.arguments) if spec.kind == WaitKind.APPROVAL else ""
        found = wait_at(run.id, run.branch, seq)
        if found is not None and (
            found.kind != spec.kind or found.name != spec.name[:200] or found.digest != wanted
        ):
            claimed = locked.checkpoint
            if claimed is not None and outcomes.unsettled(
                kind=claimed.kind, status=claimed.status, retryable=claimed.retryable
            ):
                # The call decided on was claimed and may have acted: asking again about
                # another call would let a rejection write that attempt off as never made.
                run_park(
                    run.id,
                    seq,
                    f"outcome unknown: {claimed.name} may have acted as approved "
                    f"({found.name}, digest {found.digest[:12]}), and the call at {seq} is "
                    f"now another ({spec.name}, digest {wanted[:12]}); check the partner",
                    kind=RunEvent.Kind.OUTCOME_UNKNOWN,
                    fence=claimed.fence,
                )
                return None
            _set_aside(run.id, run.branch, seq, found, spec)
            found = None
        if found is None:
            _record(run, seq, spec, wanted)
            found = wait_at(run.id, run.branch, seq)
            assert found is not None
        if found.outcome is not None:
            return found.outcome
        if found.kind == WaitKind.SIGNAL:
            taken = signal_take(run.id, run.branch, seq, found)
            if taken is not None:
                event_add(
                    run.id,
                    RunEvent.Kind.SIGNAL,
                    f"signal {found.name!r} ({taken.signal_id}) taken by the wait at {seq}: "
                    f"kept since {event_time(taken.received_at)}",
                    actor="signal",
                    seq=seq,
                    data={
                        "name": found.name,
                        "signal_id": taken.signal_id,
                        "kept_since": event_time(taken.received_at),
                    },
                )
                return {"payload": taken.payload}
        if found.due:
            return _time_out(run.id, seq, found)
        _sleep_until_deadline(
            run.id,
            seq,
            found,
            doorbell=locked.status != RunStatus.WAITING,
            recheck=spec.recheck_seconds or RECHECK_SECONDS,
        )
    return None


def _record(run: StepState, seq: int, spec: WaitSpec, wanted: str) -> None:
    """The wait as the run first reaches it: deadline by the database's clock, the exact call
    for an approval. A fork's call byte-identical to one an operator decided in an earlier
    branch reuses that decision (docs/workflows.md, "Timers, signals and approvals"); any other call
    needs a fresh one."""
    reused = _decided_before(run.id, run.branch, wanted) if wanted and run.branch else None
    seconds = spec.seconds
    if spec.kind == WaitKind.APPROVAL and seconds is None:
        seconds = float(settings.AGENTFLOW_APPROVAL_TIMEOUT)
    deadline: Any = spec.until if spec.until is not None else None
    if deadline is None and seconds is not None:
        deadline = sql.at_now_plus(seconds)
    arguments = normalise(spec.arguments) if spec.kind == WaitKind.APPROVAL else None
    sql.insert(
        sql.WAITS,
        {
            "run_id": run.id,
            "branch": run.branch,
            "seq": seq,
            "kind": str(spec.kind),
            "name": spec.name[:200],
            "arguments": arguments,
            "digest": wanted,
            "requested_at": sql.at_now(),
            "deadline": deadline,
            "resolved_at": sql.at_now() if reused is not None else None,
            "outcome": reused.outcome if reused is not None else None,
            "actor": reused.actor if reused is not None else "",
            "reason": reused.reason if reused is not None else "",
        },
    )
    if reused is not None:
        approved = Decision.from_json(reused.outcome or {}).approved
        event_add(
            run.id,
            RunEvent.Kind.OPERATOR_APPROVE if approved else RunEvent.Kind.OPERATOR_REJECT,
            f"{spec.name}: the decision of branch {reused.branch} (call {reused.seq}) reused "
            "for the byte-identical call",
            actor=reused.actor,
            seq=seq,
            data={
                "call": spec.name,
                "arguments": arguments,
                "digest": wanted,
                "reused_from": {"branch": reused.branch, "seq": reused.seq},
            },
        )
        return
    what = {
        WaitKind.TIMER: "a timer",
        WaitKind.SIGNAL: f"signal {spec.name!r}",
        WaitKind.APPROVAL: f"approval of {spec.name}",
    }[WaitKind(spec.kind)]
    event_add(
        run.id,
        RunEvent.Kind.WAITING,
        f"waiting for {what}",
        seq=seq,
        data={
            "kind": str(spec.kind),
            "name": spec.name,
            "arguments": arguments,
            "digest": wanted or None,
            "seconds": seconds,
            "until": event_time(spec.until),
        },
    )


@dataclass(frozen=True, kw_only=True)
class Taken:
    """A kept signal, as the wait that consumed it found it."""

    signal_id: str
    payload: Any
    received_at: datetime


class _Lost(Exception):
    """The signal or the wait changed under us: nothing of the take is kept."""


def signal_take(run_id: str, branch: int, seq: int, found: OpenWait) -> Taken | None:
    """Consume, for the open signal wait `found` at (`branch`, `seq`), the oldest signal of its
    name that no wait has consumed and that arrived before the wait's deadline (one that came
    later lost the race to the timeout, and stays kept for a later wait); None if there is
    none. The signal is marked consumed and the wait resolved with its payload together, each
    a compare-and-set, in the caller's transaction and under the run's row lock that every
    delivery takes too: a signal is consumed by one wait, once, and two waits of one name take
    the signals in the order they arrived."""
    row = sql.fetch_one(
        f"""SELECT s.id, s.signal_id, s.payload, s.received_at
        FROM {sql.SIGNALS} s JOIN {sql.WAITS} w ON w.id = %s
        WHERE s.run_id = %s AND s.name = %s AND s.consumed_at IS NULL
          AND (w.deadline IS NULL OR s.received_at <= w.deadline)
        ORDER BY s.id LIMIT 1""",
        [found.id, run_id, found.name],
    )
    if row is None:
        return None
    taken = Taken(
        signal_id=row[1],
        payload=sql.read_json(row[2]),
        received_at=sql.read_datetime(row[3]),  # type: ignore[arg-type]
    )
    try:
        with transaction.atomic():
            consumed = sql.update(
                sql.SIGNALS,
                {"consumed_at": sql.at_now(), "branch": branch, "seq": seq},
                "id = %s AND consumed_at IS NULL",
                [row[0]],
            )
            if consumed != 1 or not _resolve(
                found.id, {"payload": taken.payload}, actor="signal", reason=taken.signal_id
            ):
                raise _Lost
    except _Lost:
        return None
    return taken


def _decided_before(run_id: str, branch: int, wanted: str) -> RunWait | None:
    """The latest decision an operator made on this exact call in an earlier branch (a
    timeout is not a decision: the new branch asks again)."""
    earlier = RunWait.objects.filter(
        run_id=run_id,
        kind=WaitKind.APPROVAL,
        digest=wanted,
        branch__lt=branch,
        resolved_at__isnull=False,
    ).order_by("-branch", "-seq")
    for row in earlier:
        if isinstance(row.outcome, dict) and not row.outcome.get("timed_out"):
            return row
    return None


def _set_aside(run_id: str, branch: int, seq: int, found: OpenWait, spec: WaitSpec) -> None:
    """The wait at this position is not the one recorded (another signal, or a call whose
    arguments changed between replays): a decision binds to the exact call, so the old record
    goes (kept in an event) and the new wait is recorded in its place."""
    sql.execute(f"DELETE FROM {sql.WAITS} WHERE id = %s", [found.id])
    # A signal it consumed was never read by a checkpoint (the position is not recorded yet):
    # it is kept again, for this wait or a later one, rather than lost with the old record.
    released = sql.update(
        sql.SIGNALS,
        {"consumed_at": None, "branch": None, "seq": None},
        "run_id = %s AND branch = %s AND seq = %s AND consumed_at IS NOT NULL",
        [run_id, branch, seq],
    )
    event_add(
        run_id,
        RunEvent.Kind.WAITING,
        f"the wait at {seq} is now for {spec.kind} {spec.name}; the earlier one "
        f"({found.kind} {found.name}, and any decision on it) no longer applies",
        seq=seq,
        data={
            "replaced": {
                "kind": found.kind,
                "name": found.name,
                "digest": found.digest,
                "arguments": found.arguments,
                "outcome": found.outcome,
            },
            "signals_kept_again": released,
        },
    )


def _time_out(run_id: str, seq: int, found: OpenWait) -> Any:
    """The deadline passed first: a timer's end, a signal's timeout, an approval's reject."""
    if found.kind == WaitKind.TIMER:
        outcome: Any = {"woke_at": event_time(found.deadline)}
        reason = "its time came"
    elif found.kind == WaitKind.SIGNAL:
        outcome = {"timed_out": True}
        reason = f"no signal {found.name!r} before its timeout"
    else:
        reason = f"no decision on {found.name} before {event_time(found.deadline)}"
        outcome = Decision(approved=False, actor="engine", reason=reason, timed_out=True).as_json()
    _resolve(found.id, outcome, actor="engine", reason=reason)
    if found.kind != WaitKind.TIMER:
        event_add(
            run_id,
            RunEvent.Kind.WAIT_TIMED_OUT,
            reason,
            seq=seq,
            data={"kind": found.kind, "name": found.name, "digest": found.digest or None},
        )
    return outcome


def _resolve(wait_id: int, outcome: Any, *, actor: str, reason: str) -> bool:
    return bool(
        sql.update(
            sql.WAITS,
            {
                "outcome": outcome,
                "resolved_at": sql.at_now(),
                "actor": actor[:150],
                "reason": reason,
            },
            "id = %s AND resolved_at IS NULL",
            [wait_id],
        )
    )


def _sleep_until_deadline(
    run_id: str, seq: int, found: OpenWait, *, doorbell: bool, recheck: float = RECHECK_SECONDS
) -> None:
    """WAITING, woken at the deadline by the sweeper (or a short countdown message), or
    earlier by the signal or decision; no worker is held meanwhile.

    `doorbell`: this delivery moved the run to WAITING, so it publishes the countdown. A
    delivery that finds it WAITING already (that countdown arriving early, a duplicate, a
    Resume now) does not: each would ring again, and the wake-up time stands behind it."""
    remaining = found.remaining_seconds
    wake = sql.at_now_plus(recheck) if remaining is None else found.deadline
    sql.update(
        sql.RUNS,
        {"status": RunStatus.WAITING, "wake_at": wake, "updated_at": sql.at_now()},
        f"id = %s AND current_seq = %s AND status IN ({sql.placeholders(ACTIVE)})",
        [run_id, seq, *ACTIVE],
    )
    if doorbell and remaining is not None and remaining <= dispatch.MAX_COUNTDOWN_SECONDS:
        dispatch.send_step_on_commit(run_id, seq, countdown=max(remaining, 0.0))


# --- from anywhere: a signal, a decision ---------------------------------------------------------
def _open_wait(run: WorkflowRun, what: str) -> OpenWait:
    """The unresolved wait at the run's current position, or ActionRefused saying why none."""
    if run.status in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED):
        raise ActionRefused(f"the run is finished ({run.get_status_display().lower()})")
    if run.status != RunStatus.WAITING:
        raise ActionRefused(
            f"nothing waits for {what}: the run is {run.get_status_display().lower()}"
        )
    if run.cancel_requested:
        raise ActionRefused("the run is being cancelled")
    found = wait_at(run.id, run.branch, run.current_seq)
    if found is None:
        raise ActionRefused(f"nothing waits for {what}: the run is waiting to retry a step")
    if found.outcome is not None:
        raise ActionRefused(_over(found, what))
    return found


def _over(found: OpenWait, what: str) -> str:
    """Why a wait already resolved takes nothing more. Its run can still read WAITING: a
    timeout is recorded before the step that takes the reject path is checkpointed."""
    timed_out = isinstance(found.outcome, dict) and found.outcome.get("timed_out") is True
    if timed_out and found.kind == WaitKind.APPROVAL:
        return (
            f"the approval of {found.name} timed out at {event_time(found.deadline)}; "
            "the run takes the reject path"
        )
    if timed_out:
        return f"the wait for signal {found.name!r} timed out; the run goes on without it"
    return f"nothing waits for {what}: the wait at its position is over (resolved already)"


def wait_decide(
    run_id: str,
    *,
    approved: bool,
    actor: str,
    reason: str,
    digest: str | None = None,
    reply: str = "",
) -> None:
    """Record an operator's decision on the call the run waits to make, at its position and
    bound to its digest, and move the run on (approved: the call runs; rejected: it does not,
    and the step records the rejection). One commit, fenced on the run's row lock like Cancel,
    Retry and Fork: whichever comes second finds the run changed and is refused.

    `digest`: the call the decider was shown (`call_digest`); given, the decision is refused
    unless the run waits for exactly that call still (a page left open while the call at the
    position was replaced, or the run moved on to another call, decides nothing unseen).
    `reply`: what the decision tells the person the run serves (agentflow._core.replies), kept with
    it apart from the internal `reason`.

    Raises:
        ActionRefused: nothing waits for approval (not waiting, finished, cancelling, waiting
            for something else), its timeout has passed (it takes the reject path), or it
            waits for another call than the one `digest` names.
    """
    with transaction.atomic():
        run = locked_run(run_id)
        found = _open_wait(run, "approval")
        if found.kind != WaitKind.APPROVAL:
            raise ActionRefused(f"nothing waits for approval: the run waits for a {found.kind}")
        if found.due:
            raise ActionRefused(
                f"the approval of {found.name} timed out at {event_time(found.deadline)}; "
                "the run takes the reject path"
            )
        if digest is not None and digest != found.digest:
            raise ActionRefused(
                f"the call waiting for approval is not the one you were shown: it is now "
                f"{found.name} (digest {found.digest[:12]}); look at it again"
            )
        decision = Decision(approved=approved, actor=actor, reason=reason, reply=reply)
        if not _resolve(found.id, decision.as_json(), actor=actor, reason=reason):
            raise ActionRefused("someone else decided first")
        wake_waiting(run)
        event_add(
            run.id,
            RunEvent.Kind.OPERATOR_APPROVE if approved else RunEvent.Kind.OPERATOR_REJECT,
            reason or "(no reason given)",
            actor=actor,
            seq=run.current_seq,
            data={
                "call": found.name,
                "arguments": found.arguments,
                "digest": found.digest,
                "reply": reply,
            },
        )


def wake_waiting(run: WorkflowRun) -> None:
    moved = sql.update(
        sql.RUNS,
        {"status": RunStatus.RUNNING, "wake_at": wake_soon(), "updated_at": sql.at_now()},
        "id = %s AND current_seq = %s AND status = %s AND branch = %s",
        [run.id, run.current_seq, RunStatus.WAITING, run.branch],
    )
    assert moved == 1  # under the row lock
    dispatch.send_step_on_commit(run.id, run.current_seq)


# --- reads -------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class PendingWait:
    kind: str
    name: str
    arguments: Any
    digest: str
    requested_at: datetime
    deadline: datetime | None


def wait_pending(run: WorkflowRun) -> PendingWait | None:
    """What a WAITING run waits for at its position (None: nothing, or a retry back-off)."""
    if run.status != RunStatus.WAITING:
        return None
    found = wait_at(run.id, run.branch, run.current_seq)
    if found is None or found.outcome is not None:
        return None
    return PendingWait(
        kind=found.kind,
        name=found.name,
        arguments=found.arguments,
        digest=found.digest,
        requested_at=found.requested_at,
        deadline=found.deadline,
    )
