"""The sandbox's SQLite store: one WAL file of effects, idempotency keys, counters and faults."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS idempotency_keys (
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    status INTEGER,              -- NULL while the first request is still executing (in flight)
    body TEXT,
    created REAL NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX IF NOT EXISTS idempotency_keys_created ON idempotency_keys (created);
CREATE TABLE IF NOT EXISTS effects (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    idempotency_key TEXT,
    workflow_id TEXT,
    amount INTEGER,
    subject TEXT,                -- what the effect is about: a payment intent, a booking
    created REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS effects_kind_subject ON effects (kind, subject);
CREATE TABLE IF NOT EXISTS emails (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id TEXT NOT NULL UNIQUE,
    workflow_id TEXT,
    recipients TEXT NOT NULL,
    subject TEXT NOT NULL,
    body TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    last_delivery REAL NOT NULL,
    deliveries INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    kind TEXT NOT NULL,          -- 'requests' or 'replays'
    endpoint TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (kind, endpoint)
);
CREATE TABLE IF NOT EXISTS faults (
    endpoint TEXT PRIMARY KEY,
    latency_ms INTEGER NOT NULL,
    error_rate REAL NOT NULL,
    error_status INTEGER NOT NULL,
    drop_rate REAL NOT NULL,
    remaining INTEGER,           -- NULL: fires for ever; otherwise disarms at 0
    barrier INTEGER NOT NULL DEFAULT 0,
    barrier_timeout_ms INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS unknown_bookings (reference TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS cancelled_flights (
    flight TEXT NOT NULL,
    date TEXT NOT NULL,
    passengers INTEGER NOT NULL,
    rebooked_date TEXT NOT NULL,  -- the same flight's next day it flies
    created REAL NOT NULL,
    PRIMARY KEY (flight, date)
);
"""

TABLES = (
    "idempotency_keys",
    "effects",
    "emails",
    "counters",
    "faults",
    "unknown_bookings",
    "cancelled_flights",
)


class Store:
    """One connection behind a lock: every statement is short, so serialising them is cheap.

    The HTTP threads and the SMTP thread share it; writes use `BEGIN IMMEDIATE` so an effect and
    the response stored for its key commit together or not at all (kill -9 leaves no half).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(
            self.path, check_same_thread=False, isolation_level=None, timeout=30
        )
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL is durable against a killed process (WAL), which is the crash the tests make.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        columns = {row["name"] for row in self._db.execute("PRAGMA table_info(emails)")}
        if "body" not in columns:  # a state file from before bodies were kept
            self._db.execute("ALTER TABLE emails ADD COLUMN body TEXT NOT NULL DEFAULT ''")
        columns = {row["name"] for row in self._db.execute("PRAGMA table_info(faults)")}
        for column in ("barrier", "barrier_timeout_ms"):  # a state file from before barriers
            if column not in columns:
                self._db.execute(
                    f"ALTER TABLE faults ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0"
                )
        # A request that was executing when the process died stored nothing: free its key.
        with self.transaction() as db:
            db.execute("DELETE FROM idempotency_keys WHERE status IS NULL")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; commits on success, rolls back on any exception."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def select(self, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def count(self, kind: str, endpoint: str) -> None:
        """Add one to a request or replay counter."""
        with self.transaction() as db:
            db.execute(
                "INSERT INTO counters (kind, endpoint, n) VALUES (?, ?, 1) "
                "ON CONFLICT (kind, endpoint) DO UPDATE SET n = n + 1",
                (kind, endpoint),
            )

    def reset(self) -> None:
        """Forget everything: effects, keys, counters, faults (tests start from zero)."""
        with self.transaction() as db:
            for table in TABLES:
                db.execute(f"DELETE FROM {table}")  # fixed table names, never input

    def close(self) -> None:
        with self._lock:
            self._db.close()


def add_effect(
    db: sqlite3.Connection,
    *,
    kind: str,
    id: str,
    idempotency_key: str | None,
    workflow_id: str | None,
    body: dict[str, Any],
    amount: int | None = None,
    subject: str | None = None,
) -> None:
    """Record one real effect, inside the caller's transaction."""
    db.execute(
        "INSERT INTO effects"
        " (id, kind, idempotency_key, workflow_id, amount, subject, created, body)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (id, kind, idempotency_key, workflow_id, amount, subject, time.time(), json.dumps(body)),
    )
