"""The rows of concurrency keys: who may run now among the runs that share a key.

A run is admitted when its key has fewer admitted runs than its cap; otherwise it waits
(WAITING, held as `concurrency:<digest>`, no message out). Every decision counts the key's
admitted runs while holding the key's row lock (`ConcurrencyKey`), so two starts, or a start
and a finish, on any two hosts are decided one after the other: the count never reads a state
another decision is about to change. Admitted = not finished and not waiting for the key: a
run parked for an operator keeps its place, since what it did to the key's subject is not known
to be over.

The next runs are admitted when one ends (`concurrency_run_ended`, after its end commits) and,
should that hand-off be lost to a crash, by the sweeper (`concurrency_sweep`). Both admit in
arrival order; the sweeper takes the keys whose oldest waiter is oldest first.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db import DatabaseError, transaction

from agentflow import _concurrency
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow._conf import settings
from agentflow._core import dispatch
from agentflow._observe import telemetry
from agentflow._store import sql
from agentflow._store.events import event_add
from agentflow.models import ConcurrencyKey, RunEvent

logger = logging.getLogger("agentflow.store.concurrency")  # the name hosts' LOGGING knows

KEYS = ConcurrencyKey._meta.db_table
#: Statuses in which an admitted run keeps its place (parked: an operator decides its end).
_HOLDING = (*ACTIVE_RUN_STATUSES, RunStatus.NEEDS_ATTENTION)
#: A waiting run needs no sweeper by time (it is admitted by its key, or by the key's sweep),
#: but a run is active only with a wake-up time: this far on, the due-runs sweep never meets it.
WAIT_WAKE_SECONDS = 30 * 24 * 3600.0


@dataclass(frozen=True, kw_only=True)
class Admitted:
    id: str
    seq: int
    priority: int | None


def _lock(digest: str, *, skip_locked: bool = False) -> bool:
    """Take the key's row lock until the transaction ends (creating the row if need be)."""
    if not sql.postgres():
        sql.execute(
            f"INSERT INTO {KEYS} (digest, created_at) VALUES (%s, {sql.now()}) "
            "ON CONFLICT (digest) DO NOTHING",
            [digest],
        )
        return True  # SQLite's IMMEDIATE transactions serialise every writer
    if skip_locked:
        row = sql.fetch_one(
            f"SELECT digest FROM {KEYS} WHERE digest = %s FOR UPDATE SKIP LOCKED", [digest]
        )
        return row is not None
    # An upsert that updates locks the row in one statement, whether it was there or not.
    sql.execute(
        f"INSERT INTO {KEYS} (digest, created_at) VALUES (%s, {sql.now()}) "
        "ON CONFLICT (digest) DO UPDATE SET digest = excluded.digest",
        [digest],
    )
    return True


def _admitted(digest: str) -> int:
    row = sql.fetch_one(
        f"SELECT count(*) FROM {sql.RUNS} WHERE concurrency_key = %s "
        f"AND status IN ({sql.placeholders(_HOLDING)}) AND hold <> %s",
        [digest, *_HOLDING, _concurrency.token(digest)],
    )
    return int(row[0]) if row else 0


def concurrency_admit_new(digest: str, limit: int) -> bool:
    """May a run about to be created with this key start now? Part of the caller's transaction,
    which must create the run (WAITING and held, when not) before it commits: the key stays
    locked until then, so the next start counts this one."""
    _lock(digest)
    return _admitted(digest) < limit


def concurrency_held(run_id: str, reason: str, digest: str, *, seq: int = 1) -> None:
    """The event of a run waiting for its key, created so or retried (its hold is its row's)."""
    event_add(
        run_id, RunEvent.Kind.HELD, reason, seq=seq, data={"hold": _concurrency.token(digest)}
    )


# --- many runs at once (`store.children.runs_create_many`) ---------------------------------------
#: Keys per statement when many runs are started together: a few statements per thousand.
MANY_KEYS = 1000


def concurrency_admit_many(wanted: Sequence[tuple[str, int]]) -> list[bool]:
    """For runs about to be created together, each (digest, cap) in arrival order: which may
    start now (True) and which wait for their key. The same decision as `concurrency_admit_new`
    for each, and part of the caller's transaction in the same way, in a few statements
    whatever the count: every key is locked (in digest order, so two bulk starts never wait on
    each other in a circle) and its admitted runs counted once, then the runs take the free
    places in the order given."""
    digests = sorted({digest for digest, _ in wanted})
    admitted: dict[str, int] = {}
    for first in range(0, len(digests), MANY_KEYS):
        chunk = digests[first : first + MANY_KEYS]
        _lock_many(chunk)
        admitted.update(_admitted_many(chunk))
    decided = []
    for digest, limit in wanted:
        taken = admitted.get(digest, 0)
        decided.append(taken < limit)
        if taken < limit:
            admitted[digest] = taken + 1
    return decided


def _lock_many(digests: Sequence[str]) -> None:
    """`_lock` for each key, in one statement (a row is updated once: keys are distinct)."""
    rows = ", ".join(f"(%s, {sql.now()})" for _ in digests)
    conflict = "DO UPDATE SET digest = excluded.digest" if sql.postgres() else "DO NOTHING"
    sql.execute(
        f"INSERT INTO {KEYS} (digest, created_at) VALUES {rows} ON CONFLICT (digest) {conflict}",
        list(digests),
    )


def _admitted_many(digests: Sequence[str]) -> dict[str, int]:
    """`_admitted` of each key (a keyed run's only concurrency hold is its own key's)."""
    rows = sql.fetch_all(
        f"SELECT concurrency_key, count(*) FROM {sql.RUNS} "
        f"WHERE concurrency_key IN ({sql.placeholders(digests)}) "
        f"AND status IN ({sql.placeholders(_HOLDING)}) AND hold NOT LIKE %s "
        "GROUP BY concurrency_key",
        [*digests, *_HOLDING, f"{_concurrency.HOLD}:%"],
    )
    return {str(digest): int(n) for digest, n in rows}


def concurrency_held_many(held: Sequence[tuple[str, str, str]]) -> None:
    """`concurrency_held` for runs created together, each (run id, reason, digest): one INSERT
    of their events."""
    if not held:
        return
    rows, params = [], []
    for run_id, why, digest in held:
        rows.append(f"(%s, {sql.now()}, %s, 'engine', %s, 1, %s)")
        params += [
            run_id,
            RunEvent.Kind.HELD,
            why,
            sql.adapt("data", {"hold": _concurrency.token(digest)}),
        ]
    sql.execute(
        f"INSERT INTO {sql.EVENTS} (run_id, at, kind, actor, detail, seq, data) "
        f"VALUES {', '.join(rows)}",
        params,
    )
    for run_id, _, _ in held:
        telemetry.event_recorded(run_id, RunEvent.Kind.HELD)


def concurrency_release_on_commit(digests: Iterable[str]) -> None:
    """Look at these keys' waiters once the caller commits: runs created waiting behind a run
    that, as it turned out, was not created (its business key had a run already)."""
    for digest in sorted(set(digests)):
        transaction.on_commit(partial(_release_quietly, digest))


def concurrency_release(digest: str, *, skip_locked: bool = False) -> list[Admitted]:
    """Admit the key's oldest waiting runs into the places free now, and publish each once
    this commits. The key's row goes with its last run."""
    token = _concurrency.token(digest)
    with transaction.atomic():
        if not _lock(digest, skip_locked=skip_locked):
            return []  # another decision on this key is under way: it admits
        waiting = sql.fetch_all(
            f"SELECT id, current_seq, priority, concurrency_limit FROM {sql.RUNS} "
            "WHERE hold = %s AND status = %s ORDER BY created_at, id LIMIT %s",
            [token, RunStatus.WAITING, 1000],
        )
        admitted = _admitted(digest)
        if not waiting:
            if admitted == 0:
                sql.execute(f"DELETE FROM {KEYS} WHERE digest = %s", [digest])
            return []
        # The cap the oldest waiter was started under: a new version's cap applies to its runs.
        free = max(int(waiting[0][3] or 1) - admitted, 0)
        chosen = waiting[:free]
        if not chosen:
            return []
        grace = float(settings.AGENTFLOW_LEASE_SECONDS)
        ids = [row[0] for row in chosen]
        moved = {
            row[0]
            for row in sql.fetch_all(
                f"UPDATE {sql.RUNS} SET status = %s, hold = '', wake_at = {sql.now_plus()}, "
                f"updated_at = {sql.now()} WHERE id IN ({sql.placeholders(ids)}) "
                "AND hold = %s AND status = %s RETURNING id",
                [RunStatus.PENDING, grace, *ids, token, RunStatus.WAITING],
            )
        }
        released = [
            Admitted(id=r[0], seq=int(r[1]), priority=r[2]) for r in chosen if r[0] in moved
        ]
        for run in released:
            event_add(run.id, RunEvent.Kind.RELEASED, "its concurrency key is free", seq=run.seq)
            dispatch.send_step_on_commit(run.id, run.seq, priority=run.priority)
    return released


def concurrency_run_ended(run: Any) -> None:
    """`run` (a StepState or a model row) just ended, in the caller's transaction: once that
    commits, its key's next waiters are admitted. A crash in between loses only the hand-off,
    which the sweeper repeats."""
    digest = getattr(run, "concurrency_key", "")
    if digest:
        transaction.on_commit(lambda: _release_quietly(digest))


def concurrency_run_ended_id(run_id: str) -> None:
    """As `concurrency_run_ended`, for a caller that holds only the run's id."""
    row = sql.fetch_one(f"SELECT concurrency_key FROM {sql.RUNS} WHERE id = %s", [run_id])
    if row is not None and row[0]:
        digest = row[0]
        transaction.on_commit(lambda: _release_quietly(digest))


def _release_quietly(digest: str) -> None:
    try:
        concurrency_release(digest)
    except DatabaseError:
        logger.exception("the next run of a concurrency key was not admitted; the sweeper will")


def concurrency_sweep(limit: int | None = None) -> int:
    """Admit waiters whose key has a free place (a hand-off lost in a crash, a holder deleted):
    the keys whose oldest waiter is oldest first, each in its own transaction, skipping a key
    another decision holds. Returns how many runs were admitted."""
    keys = sql.fetch_all(
        f"SELECT concurrency_key FROM {sql.RUNS} WHERE hold LIKE %s AND status = %s "
        "GROUP BY concurrency_key ORDER BY min(created_at) LIMIT %s",
        [
            f"{_concurrency.HOLD}:%",
            RunStatus.WAITING,
            limit or settings.AGENTFLOW_CONCURRENCY_SWEEP_KEYS,
        ],
    )
    admitted = 0
    for (digest,) in keys:
        try:
            admitted += len(concurrency_release(digest, skip_locked=True))
        except DatabaseError:
            logger.exception("sweeper: a concurrency key's waiters were not looked at")
    return admitted


def concurrency_waiting(digest: str) -> list[str]:
    """The key's waiting runs in the order they will be admitted (for pages and tests)."""
    rows = sql.fetch_all(
        f"SELECT id FROM {sql.RUNS} WHERE hold = %s AND status = %s ORDER BY created_at, id",
        [_concurrency.token(digest), RunStatus.WAITING],
    )
    return [row[0] for row in rows]
