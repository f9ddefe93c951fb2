"""Builds and where runs stand on them (docs/deploys.md, "Builds"): the builds table, live workers
per build, and the fenced writes that move a run to a newer build, pin it to its own, hold it until
it may start, and release it. The decisions are `agentflow._builds.routing`'s; these only record
them.

Each write is a compare-and-set on what the decision read (the run's build, its position, that
it is active, that no live claim is running its step), so two workers of different builds racing
for one run's step cannot both act: the run's build is part of every claim's fence
(`steps._as_decided`), and a move is refused while a live worker holds the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from agentflow._base.states import RunStatus, StepStatus
from agentflow._conf import settings
from agentflow._core import builds, leases
from agentflow._store import sql
from agentflow._store.events import event_add
from agentflow._store.steps import ACTIVE
from agentflow.models import RunEvent

#: A worker whose heartbeat is older than this is not counted live, lock or not (a host that
#: vanished without closing its sockets). Heartbeats come every `roster.BEAT_SECONDS`.
WORKER_TTL_SECONDS = 15.0

_FREE_STEP = f"""NOT EXISTS (
    SELECT 1 FROM {sql.STEPS} c WHERE c.run_id = %s AND c.seq = %s
      AND c.status = 'IN_PROGRESS' AND NOT ({sql.claimable("c")}))"""


# --- the builds table -----------------------------------------------------------------------------
def build_record(build: str, definitions: dict[str, Any]) -> None:
    """This build ran something: its row (first seen now, if new) and its last-seen time."""
    with sql.cursor() as cur:
        cur.execute(
            f"""
            INSERT INTO {sql.BUILDS} (id, definitions, first_seen_at, last_seen_at)
            VALUES (%s, %s, {sql.now()}, {sql.now()})
            ON CONFLICT (id) DO UPDATE SET last_seen_at = excluded.last_seen_at
            """,
            [build, sql.adapt("definitions", definitions)],
        )


#: Builds this process knows have their row (added once the recording commits).
_known: set[str] = set()


def build_known(build: str) -> None:
    """Record this process's build before its first run or step refers to it: one statement
    per process, not per run (a flushed test database is found again by `build_recorded`)."""
    if build in _known:
        return
    build_record(build, builds.definitions_summary())
    transaction.on_commit(lambda: _known.add(build))


def builds_first_seen(builds: Sequence[str]) -> dict[str, datetime]:
    rows = sql.fetch_all(
        f"SELECT id, first_seen_at FROM {sql.BUILDS} WHERE id IN ({sql.placeholders(builds)})",
        list(builds),
    )
    return {row[0]: sql.read_datetime(row[1]) for row in rows}  # type: ignore[misc]


def build_shape(build: str, workflow: str) -> dict[str, Any] | None:
    """The shape of `workflow` that `build` recorded (`builds.summary`), if it did."""
    row = sql.fetch_one(f"SELECT definitions FROM {sql.BUILDS} WHERE id = %s", [build])
    if row is None:
        return None
    shapes = sql.read_json(row[0]) or {}
    shape = shapes.get(workflow)
    return shape if isinstance(shape, dict) else None


# --- workers --------------------------------------------------------------------------------------
def worker_beat(*, name: str, build: str, queue: str, lock: int | None, server: str) -> None:
    """A worker of `build` is alive: its row's heartbeat, and its build's last-seen time."""
    with transaction.atomic():
        with sql.cursor() as cur:
            cur.execute(
                f"""
                INSERT INTO {sql.WORKERS} (name, build, queue, started_at, seen_at, lock,
                                           lock_server)
                VALUES (%s, %s, %s, {sql.now()}, {sql.now()}, %s, %s)
                ON CONFLICT (name) DO UPDATE SET seen_at = excluded.seen_at,
                    lock = excluded.lock, lock_server = excluded.lock_server
                """,
                [name, build, queue, lock, server],
            )
        sql.execute(f"UPDATE {sql.BUILDS} SET last_seen_at = {sql.now()} WHERE id = %s", [build])


def worker_gone(name: str) -> None:
    """A worker shut down warmly: it is no longer counted (a killed one is, until its lock
    or its heartbeat says otherwise)."""
    sql.execute(f"DELETE FROM {sql.WORKERS} WHERE name = %s", [name])


def _live_sql() -> str:
    """SQL over a worker row `w`: it is alive. Its heartbeat is recent and, on Postgres, its
    liveness lock (when it holds one, taken since the server's last restart, on this server)
    is still held: a SIGKILLed worker is gone at once."""
    recent = f"{sql.seconds_since('w.seen_at')} < %s"
    if not sql.postgres():
        return recent
    return f"""{recent} AND (CASE WHEN w.lock IS NULL
                   OR w.started_at <= {leases.LOCKS_SINCE_SQL}
                   OR w.lock_server <> {leases.SERVER_SQL} THEN true
              ELSE EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid::bigint = (w.lock >> 32)
          AND l.objid::bigint = (w.lock & 4294967295)) END)"""


def workers_live(builds: Sequence[str]) -> dict[str, int]:
    """How many live workers each of `builds` has (absent: none)."""
    if not builds:
        return {}
    rows = sql.fetch_all(
        f"SELECT w.build, COUNT(*) FROM {sql.WORKERS} w "
        f"WHERE w.build IN ({sql.placeholders(builds)}) AND {_live_sql()} GROUP BY w.build",
        [*builds, WORKER_TTL_SECONDS],
    )
    return {row[0]: int(row[1]) for row in rows}


@dataclass(frozen=True, kw_only=True)
class BuildRow:
    """A build as `agentflow_builds` and the dashboard show it."""

    id: str
    first_seen_at: datetime
    last_seen_at: datetime
    workflows: dict[str, int]
    live_workers: list[str]
    #: Active runs on it, and those of them pinned to it.
    active_runs: int
    pinned_runs: list[str]
    held_runs: int


def builds_overview(*, pinned_listed: int = 20) -> list[BuildRow]:
    """Every build, newest first, with its live workers and its active runs."""
    builds = sql.fetch_all(
        f"SELECT id, first_seen_at, last_seen_at, definitions FROM {sql.BUILDS} "
        "ORDER BY first_seen_at DESC",
        [],
    )
    live: dict[str, list[str]] = {}
    for build, name in sql.fetch_all(
        f"SELECT w.build, w.name FROM {sql.WORKERS} w WHERE {_live_sql()} ORDER BY w.name",
        [WORKER_TTL_SECONDS],
    ):
        live.setdefault(build, []).append(name)
    counts: dict[str, tuple[int, int]] = {}
    for build, active, held in sql.fetch_all(
        f"SELECT build, COUNT(*), SUM(CASE WHEN hold <> '' THEN 1 ELSE 0 END) FROM {sql.RUNS} "
        f"WHERE status IN ({sql.placeholders(ACTIVE)}) GROUP BY build",
        ACTIVE,
    ):
        counts[build] = (int(active), int(held or 0))
    rows = []
    for build_id, first, last, definitions in builds:
        pinned = [
            row[0]
            for row in sql.fetch_all(
                f"SELECT id FROM {sql.RUNS} WHERE build = %s AND pinned "
                f"AND status IN ({sql.placeholders(ACTIVE)}) ORDER BY created_at LIMIT %s",
                [build_id, *ACTIVE, pinned_listed],
            )
        ]
        shapes = sql.read_json(definitions) or {}
        rows.append(
            BuildRow(
                id=build_id,
                first_seen_at=sql.read_datetime(first),  # type: ignore[arg-type]
                last_seen_at=sql.read_datetime(last),  # type: ignore[arg-type]
                workflows={name: int(shape.get("version", 0)) for name, shape in shapes.items()},
                live_workers=live.get(build_id, []),
                active_runs=counts.get(build_id, (0, 0))[0],
                pinned_runs=pinned,
                held_runs=counts.get(build_id, (0, 0))[1],
            )
        )
    return rows


def runs_per_build() -> dict[str, int]:
    """Active runs by the build they are on: the gauge (its cost follows active runs)."""
    rows = sql.fetch_all(
        f"SELECT build, COUNT(*) FROM {sql.RUNS} WHERE status IN ({sql.placeholders(ACTIVE)}) "
        "GROUP BY build",
        ACTIVE,
    )
    return {row[0]: int(row[1]) for row in rows}


# --- runs: move, pin, hold, release ---------------------------------------------------------------
def run_move(
    run_id: str,
    seq: int,
    *,
    from_build: str,
    to_build: str,
    version: int,
    kind: str = RunEvent.Kind.UPGRADED,
    actor: str = "engine",
    reason: str = "",
    statuses: Sequence[str] = ACTIVE,
) -> bool:
    """Move the run to `to_build` (and its workflow's `version` there), fenced on it still being
    on `from_build` at `seq` with no live claim on its step (a worker of the old build still
    running it finishes first; the move is decided again at the next message). It is no
    longer pinned or held. `statuses`: what it may be in (an operator also moves parked runs).
    Returns whether it moved."""
    with transaction.atomic():
        moved = sql.update(
            sql.RUNS,
            {
                "build": to_build,
                "version": version,
                "pinned": False,
                "hold": "",
                "updated_at": sql.at_now(),
            },
            f"id = %s AND build = %s AND current_seq = %s "
            f"AND status IN ({sql.placeholders(statuses)}) AND {_FREE_STEP}",
            [run_id, from_build, seq, *statuses, run_id, seq],
        )
        if not moved:
            return False
        event_add(
            run_id,
            kind,
            reason or f"moved from build {from_build or '(none)'} to {to_build}",
            actor=actor,
            seq=seq,
            data={"from": from_build, "to": to_build, "version": version},
        )
    return True


def run_pin(run_id: str, *, build: str, reason: str, data: dict[str, Any]) -> bool:
    """It finishes on `build` (a newer build could not take it); recorded once."""
    with transaction.atomic():
        pinned = sql.update(
            sql.RUNS,
            {"pinned": True, "updated_at": sql.at_now()},
            f"id = %s AND build = %s AND NOT pinned AND status IN ({sql.placeholders(ACTIVE)})",
            [run_id, build, *ACTIVE],
        )
        if pinned:
            event_add(run_id, RunEvent.Kind.PINNED, reason, data={"build": build, **data})
    return bool(pinned)


def run_hold(
    run_id: str, seq: int, *, build: str, hold: str, reason: str, recheck_seconds: float
) -> bool:
    """WAITING with the reason: its step may not start now, and no message is out for it. Looked
    at again in `recheck_seconds` (the sweeper), or released sooner. Fenced on its build and
    position, and on no live claim on its step (a running step is not waiting). An event the
    first time it is held for this reason."""
    with transaction.atomic():
        row = sql.fetch_one(
            f"SELECT hold FROM {sql.RUNS} WHERE id = %s"
            + (" FOR UPDATE" if sql.postgres() else ""),
            [run_id],
        )
        held = sql.update(
            sql.RUNS,
            {
                "status": RunStatus.WAITING,
                "hold": hold,
                "wake_at": sql.at_now_plus(recheck_seconds),
                "updated_at": sql.at_now(),
            },
            f"id = %s AND build = %s AND current_seq = %s "
            f"AND status IN ({sql.placeholders(ACTIVE)}) AND {_FREE_STEP}",
            [run_id, build, seq, *ACTIVE, run_id, seq],
        )
        if held and (row is None or row[0] != hold):
            event_add(run_id, RunEvent.Kind.HELD, reason, seq=seq, data={"hold": hold})
    return bool(held)


@dataclass(frozen=True, kw_only=True)
class Released:
    id: str
    seq: int
    build: str
    pinned: bool


def holds_release(hold: str, *, limit: int = 1000, run_ids: Sequence[str] = ()) -> list[Released]:
    """Clear `hold` from the runs it holds (all, or `run_ids`), oldest first: each is due again
    within an enqueue grace, and the caller publishes them once this commits. An event each."""
    grace = float(settings.AGENTFLOW_LEASE_SECONDS)
    only = f" AND id IN ({sql.placeholders(run_ids)})" if run_ids else ""
    with transaction.atomic():
        rows = sql.fetch_all(
            f"SELECT id, current_seq, build, pinned FROM {sql.RUNS} "
            f"WHERE hold = %s AND status IN ({sql.placeholders(ACTIVE)}){only} "
            "ORDER BY created_at LIMIT %s" + (" FOR UPDATE SKIP LOCKED" if sql.postgres() else ""),
            [hold, *ACTIVE, *run_ids, limit],
        )
        if not rows:
            return []
        ids = [row[0] for row in rows]
        sql.execute(
            f"UPDATE {sql.RUNS} SET hold = '', wake_at = {sql.now_plus()}, "
            f"updated_at = {sql.now()} WHERE id IN ({sql.placeholders(ids)})",
            [grace, *ids],
        )
        for row in rows:
            event_add(row[0], RunEvent.Kind.RELEASED, f"{hold} may go now", seq=int(row[1]))
    return [Released(id=r[0], seq=int(r[1]), build=r[2], pinned=bool(r[3])) for r in rows]


# --- what the rule reads --------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RecordedStep:
    seq: int
    name: str
    kind: str
    status: str
    retryable: bool
    idempotency_key: str
    output: Any
    arguments: Any


def run_steps_recorded(run_id: str) -> list[RecordedStep]:
    """The run's checkpoints in order (outputs and arguments included: the report's amounts)."""
    rows = sql.fetch_all(
        f"SELECT seq, name, kind, status, retryable, idempotency_key, output, arguments "
        f"FROM {sql.STEPS} WHERE run_id = %s ORDER BY seq",
        [run_id],
    )
    return [
        RecordedStep(
            seq=int(r[0]),
            name=r[1],
            kind=r[2],
            status=r[3],
            retryable=bool(r[4]),
            idempotency_key=r[5],
            output=sql.read_json(r[6]),
            arguments=sql.read_json(r[7]),
        )
        for r in rows
    ]


def open_wait_at(run_id: str, seq: int, branch: int) -> bool:
    """Does the run wait (timer, signal, approval) at `seq`, undecided?"""
    return (
        sql.fetch_one(
            f"SELECT 1 FROM {sql.WAITS} WHERE run_id = %s AND seq = %s AND branch = %s "
            "AND resolved_at IS NULL",
            [run_id, seq, branch],
        )
        is not None
    )


def in_progress_claim(run_id: str, seq: int) -> bool:
    """Is a live claim running the step at `seq` now?"""
    return (
        sql.fetch_one(
            f"SELECT 1 FROM {sql.STEPS} c WHERE c.run_id = %s AND c.seq = %s "
            f"AND c.status = %s AND NOT ({sql.claimable('c')})",
            [run_id, seq, StepStatus.IN_PROGRESS],
        )
        is not None
    )
