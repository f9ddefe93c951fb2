"""The sweeper's own record: when it last ran, so a dead beat process does not go unnoticed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentflow._conf import settings
from agentflow._core import leases
from agentflow._store import sql
from agentflow._store.events import event_add
from agentflow._store.steps import ACTIVE
from agentflow._sweeps import backoff
from agentflow.models import RunEvent

DEFAULT_SWEEPER = "sweeper"


@dataclass(frozen=True, kw_only=True)
class Heartbeat:
    name: str
    requeued: int
    query_ms: float
    #: Seconds since the sweep, by the database's clock.
    age_seconds: float
    #: Seconds since the database server last ended every session (a restart, or a crash of one
    #: of its processes): a sweep older than that was missed while the database was down, not
    #: by beat. None where it cannot tell (SQLite).
    database_seconds: float | None = None


def heartbeat_record(*, requeued: int, query_ms: float, name: str = DEFAULT_SWEEPER) -> None:
    """Upsert the sweeper's row with the database's time: one statement, one commit."""
    with sql.cursor() as cur:
        cur.execute(
            f"""
            INSERT INTO {sql.HEARTBEATS} (name, swept_at, requeued, query_ms)
            VALUES (%s, {sql.now()}, %s, %s)
            ON CONFLICT (name) DO UPDATE SET swept_at = excluded.swept_at,
                requeued = excluded.requeued, query_ms = excluded.query_ms
            """,
            [name, requeued, query_ms],
        )


def database_restarted_seconds() -> float | None:
    """Seconds since the database server last ended every session (see `Heartbeat`), for a
    sweeper that has no record yet; None where it cannot tell (SQLite)."""
    if not sql.postgres():
        return None
    row = sql.fetch_one(f"SELECT {sql.seconds_since(leases.LOCKS_SINCE_SQL)}", [])
    return None if row is None or row[0] is None else float(row[0])


def heartbeat_read(name: str = DEFAULT_SWEEPER) -> Heartbeat | None:
    """The sweeper's last record, or None if it never ran against this database."""
    restarted = sql.seconds_since(leases.LOCKS_SINCE_SQL) if sql.postgres() else "NULL"
    row = sql.fetch_one(
        f"SELECT requeued, query_ms, {sql.seconds_since('swept_at')}, {restarted} "
        f"FROM {sql.HEARTBEATS} WHERE name = %s",
        [name],
    )
    if row is None:
        return None
    return Heartbeat(
        name=name,
        requeued=int(row[0]),
        query_ms=float(row[1]),
        age_seconds=float(row[2]),
        database_seconds=None if row[3] is None else float(row[3]),
    )


@dataclass(frozen=True, kw_only=True)
class DueRun:
    """An active run the sweeper must ring the doorbell for, locked for this sweep."""

    id: str
    workflow: str
    version: int
    seq: int
    status: str
    #: "overdue": past its wake-up time; "owner_gone": its step's owner lost its advisory lock.
    reason: str
    #: How long past its wake-up time (0 for a lost owner caught before its lease ran out).
    late_seconds: float
    #: The checkpoint's fence at `seq` (None if it has none), to fence a park on.
    fence: int | None
    #: Where it stands on builds (docs/deploys.md, "Builds"): `agentflow._builds.routing` decides
    #: where it
    #: goes.
    build: str = ""
    pinned: bool = False
    hold: str = ""
    priority: int | None = None
    #: Seconds since the sweeper first rang for it with no worker writing it since; None when
    #: this is the first ring (`agentflow._sweeps.backoff` makes the gap to the next of it).
    unanswered_seconds: float | None = None


#: Rung, and no worker wrote the run since: a worker's write sets `updated_at`, the sweeper's
#: never does. `rung_at` stays at the first ring of the stretch.
_UNANSWERED = "r.rung_at IS NOT NULL AND r.updated_at <= r.rung_at"


def _due_query() -> str:
    return f"""
        SELECT r.id, r.workflow, r.version, r.current_seq, r.status,
               {sql.seconds_since("r.wake_at")},
               (SELECT c.fence FROM {sql.STEPS} c WHERE c.run_id = r.id AND c.seq = r.current_seq),
               r.build, r.pinned, r.hold, r.priority,
               CASE WHEN {_UNANSWERED} THEN {sql.seconds_since("r.rung_at")} END
        FROM {sql.RUNS} r
        WHERE r.status IN ({sql.placeholders(ACTIVE)}) AND r.wake_at <= {sql.now()}
        ORDER BY r.wake_at
        LIMIT %s {"FOR UPDATE OF r SKIP LOCKED" if sql.postgres() else ""}
    """


#: Runs whose step is IN_PROGRESS under a lease that has not run out, but whose owner's
#: advisory lock is free: the owner died (on any host). `pg_locks` is read once, into a hash.
#: Once per claim: a run rung since its (dead) owner's last write waits for its wake-up time, so
#: a message queued behind a backlog is not re-published at every sweep.
_ABANDONED_QUERY = f"""
    WITH held AS MATERIALIZED (
        SELECT (l.classid::bigint << 32) | l.objid::bigint AS key FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    )
    SELECT r.id, r.workflow, r.version, r.current_seq, r.status, 0.0, c.fence,
           r.build, r.pinned, r.hold, r.priority, NULL
    FROM {sql.RUNS} r JOIN {sql.STEPS} c ON c.run_id = r.id AND c.seq = r.current_seq
    WHERE r.status IN ({", ".join(["%s"] * len(ACTIVE))}) AND r.wake_at > now()
      AND c.status = 'IN_PROGRESS' AND c.lease_lock IS NOT NULL AND c.lease_expires_at > now()
      AND c.started_at > {leases.LOCKS_SINCE_SQL} AND c.lease_server = {leases.SERVER_SQL}
      AND NOT EXISTS (SELECT 1 FROM held WHERE held.key = c.lease_lock)
      AND NOT ({_UNANSWERED})
    LIMIT %s
    FOR UPDATE OF r SKIP LOCKED
"""


def sweep_statements(limit: int) -> list[tuple[str, str, list[Any]]]:
    """The sweeper's queries, as (reason, SQL, parameters): runs past their wake-up time, then
    (Postgres) runs whose owner is gone. `bench` times and explains exactly these."""
    statements = [("overdue", _due_query(), [*ACTIVE, limit])]
    if sql.postgres():
        statements.append(("owner_gone", _ABANDONED_QUERY, [*ACTIVE, limit]))
    return statements


def sweep_due(limit: int) -> list[DueRun]:
    """Lock the active runs that need their doorbell rung (SKIP LOCKED: two sweepers never take
    the same run). Part of the caller's transaction, which must then `sweep_push` them."""
    rows: list[tuple[Any, ...]] = []
    for reason, query, params in sweep_statements(limit):
        if len(rows) >= limit:
            break
        params[-1] = limit - len(rows)
        rows += [(*row, reason) for row in sql.fetch_all(query, params)]
    return [
        DueRun(
            id=row[0],
            workflow=row[1],
            version=int(row[2]),
            seq=int(row[3]),
            status=row[4],
            late_seconds=max(float(row[5] or 0.0), 0.0),
            fence=row[6],
            build=row[7],
            pinned=bool(row[8]),
            hold=row[9],
            priority=row[10],
            unanswered_seconds=None if row[11] is None else float(row[11]),
            reason=row[12],
        )
        for row in rows
    ]


def sweep_keep_held(runs: list[DueRun], seconds: float) -> None:
    """Held runs whose hold still stands: looked at again in `seconds`, nothing published and
    no event (the hold's own event said why, once)."""
    if runs:
        sql.execute(
            f"UPDATE {sql.RUNS} SET wake_at = {sql.now_plus()} "
            f"WHERE id IN ({sql.placeholders(runs)})",
            [seconds, *(run.id for run in runs)],
        )


def sweep_push(runs: list[DueRun]) -> None:
    """Push the locked runs' wake-up time on (so the next sweep leaves them alone while their
    message is delivered) and record one event each (I6). The gap is one lease at the first
    ring, doubling while no worker answers (`agentflow._sweeps.backoff`). A run that was held
    is held no more: it is published now. `updated_at` is left alone: it says when a worker
    last wrote the run, which is what ends a stretch of rings."""
    if not runs:
        return
    lease = float(settings.AGENTFLOW_LEASE_SECONDS)
    cap = float(settings.AGENTFLOW_SWEEP_BACKOFF_MAX_SECONDS)
    graces = {
        run.id: backoff.grace_seconds(
            lease=lease, unanswered_seconds=run.unanswered_seconds, cap=cap
        )
        for run in runs
    }
    by_grace: dict[float, list[str]] = {}
    for run_id, grace in graces.items():
        by_grace.setdefault(round(grace, 3), []).append(run_id)
    for grace, ids in by_grace.items():  # a handful of distinct gaps: lease x 1, 2, 4 ... cap
        sql.execute(
            f"UPDATE {sql.RUNS} AS r SET wake_at = {sql.now_plus()}, hold = '', "
            f"rung_at = CASE WHEN {_UNANSWERED} THEN r.rung_at ELSE {sql.now()} END "
            f"WHERE id IN ({sql.placeholders(ids)})",
            [grace, *ids],
        )
    for run in runs:
        why = (
            "its step's owner is gone"
            if run.reason == "owner_gone"
            else f"{run.late_seconds:.1f} s past its wake-up time"
        )
        grace = graces[run.id]
        event_add(
            run.id,
            RunEvent.Kind.SWEEP_REQUEUE,
            f"{run.status} at step {run.seq}, {why}; looked at again in {grace:.0f} s",
            actor="sweeper",
            seq=run.seq,
            data={
                "status": run.status,
                "reason": run.reason,
                "late_seconds": round(run.late_seconds, 3),
                "next_seconds": round(grace, 3),
            },
        )


def sweep_unsent(run_ids: list[str]) -> None:
    """The broker refused these re-publishes: they were no ring, so the back-off starts over
    and the next sweep after one lease tries again (a broker back from an outage gets every
    run within a lease, not a back-off later). A run a worker wrote meanwhile is left alone."""
    if run_ids:
        sql.execute(
            f"UPDATE {sql.RUNS} AS r SET wake_at = {sql.now_plus()}, rung_at = NULL "
            f"WHERE id IN ({sql.placeholders(run_ids)}) AND {_UNANSWERED}",
            [float(settings.AGENTFLOW_LEASE_SECONDS), *run_ids],
        )
