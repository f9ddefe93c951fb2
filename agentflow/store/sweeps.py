"""The sweeper's own record: when it last ran, so a dead beat process does not go unnoticed."""

from __future__ import annotations

from dataclasses import dataclass

from agentflow.store import sql

DEFAULT_SWEEPER = "sweeper"


@dataclass(frozen=True, kw_only=True)
class Heartbeat:
    name: str
    requeued: int
    query_ms: float
    #: Seconds since the sweep, by the database's clock.
    age_seconds: float


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


def heartbeat_read(name: str = DEFAULT_SWEEPER) -> Heartbeat | None:
    """The sweeper's last record, or None if it never ran against this database."""
    row = sql.fetch_one(
        f"SELECT requeued, query_ms, {sql.seconds_since('swept_at')} FROM {sql.HEARTBEATS} "
        "WHERE name = %s",
        [name],
    )
    if row is None:
        return None
    return Heartbeat(
        name=name, requeued=int(row[0]), query_ms=float(row[1]), age_seconds=float(row[2])
    )
