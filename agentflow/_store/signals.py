"""Signals from anywhere (docs/workflows.md, "Timers, signals and approvals"): kept the moment they
arrive, exactly once per `signal_id`, and consumed by a `wait_for` of their name
(`store.waits.signal_take`); and the receipts of signed partner webhooks, which refuse the same
signed request twice.

A signal does not need its run to be waiting for it: a partner's webhook often arrives before
the run reaches `wait_for` (DBOS keeps every `send` until a `recv` reads it; Temporal keeps a
signal in the run's history until the code handles it). Delivery takes the run's row lock, as
every wait settles under it, so a signal arriving while the run reaches its wait is consumed
once, by whichever of the two commits second.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.db import IntegrityError, transaction

from agentflow._base.states import TERMINAL_RUN_STATUSES, RunStatus, WaitKind
from agentflow._store import sql
from agentflow._store.events import event_add, event_time
from agentflow._store.operator import locked_run
from agentflow._store.waits import signal_take, wait_at, wake_waiting
from agentflow.exceptions import ActionRefused, Replayed
from agentflow.models import RunEvent

#: "delivered": recorded (consumed at once by the wait for it, or kept for a later one);
#: "duplicate": this `signal_id` was recorded before, and nothing happens again.
Delivery = Literal["delivered", "duplicate"]


def signal_deliver(run_id: str, name: str, payload: Any, *, signal_id: str) -> Delivery:
    """Record signal `name` for the run, exactly once per `signal_id`: a repeated id is
    acknowledged ("duplicate") and changes nothing, whatever the run does now. If the run waits
    for a signal of that name at its position, the wait consumes the oldest one kept (this one,
    unless an older one came in after an earlier wait's timeout) and the run moves back to
    RUNNING, in the same commit; else the signal is kept, and the next `wait_for(name)` the run
    reaches consumes it at once.

    Raises:
        ActionRefused: no such run, the run is finished, or it is being cancelled (it reaches
            no wait again).
    """
    with transaction.atomic():
        run = locked_run(run_id)
        if run.signals.filter(signal_id=signal_id).exists():
            return "duplicate"
        if run.status in TERMINAL_RUN_STATUSES:
            raise ActionRefused(f"the run is finished ({run.get_status_display().lower()})")
        if run.cancel_requested:
            raise ActionRefused("the run is being cancelled: it waits for nothing any more")
        try:
            with transaction.atomic():
                sql.insert(
                    sql.SIGNALS,
                    {
                        "run_id": run.id,
                        "signal_id": signal_id,
                        "name": name,
                        "payload": payload,
                        "received_at": sql.at_now(),
                    },
                )
        except IntegrityError:
            return "duplicate"
        found = wait_at(run.id, run.branch, run.current_seq)
        taken = None
        if (
            run.status == RunStatus.WAITING
            and found is not None
            and found.outcome is None
            and found.kind == WaitKind.SIGNAL
            and found.name == name
            and not found.due
        ):
            taken = signal_take(run.id, run.branch, run.current_seq, found)
        own = taken is not None and taken.signal_id == signal_id
        event_add(
            run.id,
            RunEvent.Kind.SIGNAL,
            f"signal {name!r} delivered ({signal_id})"
            if own
            else f"signal {name!r} received ({signal_id}); kept until a wait_for({name!r}) "
            "takes it",
            actor="signal",
            seq=run.current_seq if own else None,
            data={"name": name, "signal_id": signal_id, "kept": not own},
        )
        if taken is not None and not own:  # an older one of that name was still kept
            event_add(
                run.id,
                RunEvent.Kind.SIGNAL,
                f"signal {name!r} ({taken.signal_id}) taken by the wait at {run.current_seq}: "
                f"kept since {event_time(taken.received_at)}",
                actor="signal",
                seq=run.current_seq,
                data={
                    "name": name,
                    "signal_id": taken.signal_id,
                    "kept_since": event_time(taken.received_at),
                },
            )
        if taken is not None:
            wake_waiting(run)
    return "delivered"


def webhook_receipt_add(
    partner: str, digest: str, *, signed_at: datetime, prune_before: datetime
) -> None:
    """Record a verified webhook request of `partner` (`digest`: SHA-256 of what it signed), in
    the caller's transaction, so it is kept only if what it delivers is; receipts signed before
    `prune_before` go (their timestamps are past the tolerance: such a request is refused as
    stale before it gets here).

    Raises:
        Replayed: a receipt of the same signed request exists (a concurrent one waits on the
            unique index, then finds it).
    """
    _prune(prune_before)
    try:
        with transaction.atomic():
            sql.insert(
                sql.RECEIPTS,
                {
                    "partner": partner[:100],
                    "digest": digest,
                    "signed_at": signed_at,
                    "received_at": sql.at_now(),
                },
            )
    except IntegrityError:
        raise Replayed("this signed request was received before (a replay)") from None


#: Receipts one webhook prunes at most: a few per request keep the table to the tolerance's
#: worth of requests without making any request pay for a backlog.
PRUNE_BATCH = 100


def _prune(before: datetime) -> None:
    """Delete receipts signed before `before`, skipping those another request is deleting (so
    two webhooks never queue on each other's prune)."""
    cutoff = sql.adapt("", before)
    if sql.postgres():
        sql.execute(
            f"""DELETE FROM {sql.RECEIPTS} WHERE id IN (
                SELECT id FROM {sql.RECEIPTS} WHERE signed_at < %s
                LIMIT {PRUNE_BATCH} FOR UPDATE SKIP LOCKED)""",
            [cutoff],
        )
    else:
        sql.execute(f"DELETE FROM {sql.RECEIPTS} WHERE signed_at < %s", [cutoff])
