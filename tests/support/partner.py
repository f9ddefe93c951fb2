"""A partner stand-in outside Postgres and Redis: counts requests and effects per idempotency key.

State lives in the SQLite file named by env `TEST_PARTNER_DB`, so it survives what the crash
tests kill or restart (workers, Redis) and every process (test and workers) sees the same file.
It also keeps an execution log of step bodies and the "release" switches a blocking step waits
for: both are events the test observes or controls, never sleeps.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (key TEXT NOT NULL, pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, pid INTEGER NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS executions (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, step TEXT NOT NULL, attempt INTEGER NOT NULL,
    pid INTEGER NOT NULL, at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS releases (run_id TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS answers (id INTEGER PRIMARY KEY AUTOINCREMENT, answer TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS calls (at REAL NOT NULL, answer TEXT NOT NULL);
"""


class PartnerTimeout(RuntimeError):
    """A blocking step was never released: the test forgot to, or died first."""


def db_path() -> Path:
    return Path(os.environ["TEST_PARTNER_DB"])


def _connect(path: Path | None = None) -> sqlite3.Connection:
    # Autocommit mode with explicit BEGIN IMMEDIATE: many worker processes write at once, and a
    # writer must queue on the busy timeout rather than fail half-way.
    conn = sqlite3.connect(path or db_path(), timeout=60, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 60000")
    return conn


def create(path: Path) -> None:
    """Make a fresh, empty partner file (WAL, so readers never block the writers)."""
    with closing(_connect(path)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(SCHEMA)


# --- what steps call ---------------------------------------------------------------------------
def next_answer() -> str:
    """A limited partner's request: logged, answered with the next scripted answer ("ok" once
    the script is used up). The log is what tests count calls and their times in."""
    with closing(_connect()) as conn:
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute("SELECT id, answer FROM answers ORDER BY id LIMIT 1").fetchone()
        answer = "ok"
        if row is not None:
            conn.execute("DELETE FROM answers WHERE id = ?", (row[0],))
            answer = row[1]
        conn.execute("INSERT INTO calls VALUES (?, ?)", (time.time(), answer))
        conn.execute("COMMIT")
    return answer


def script_answers(*answers: str) -> None:
    """The limited partner's next answers, in order."""
    with closing(_connect()) as conn:
        conn.executemany("INSERT INTO answers (answer) VALUES (?)", [(a,) for a in answers])


def calls() -> list[tuple[float, str]]:
    """Every request the limited partner got: (time, answer), in order."""
    with closing(_connect()) as conn:
        return [(float(at), str(a)) for at, a in conn.execute("SELECT at, answer FROM calls")]


def apply(key: str) -> dict[str, Any]:
    """The partner's effect endpoint: every request is counted, the effect happens once per key."""
    now = time.time()
    with closing(_connect()) as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO requests VALUES (?, ?, ?)", (key, os.getpid(), now))
        applied = conn.execute(
            "INSERT OR IGNORE INTO effects VALUES (?, ?, ?)", (key, os.getpid(), now)
        ).rowcount
        conn.execute("COMMIT")
    return {"key": key, "replayed": not applied}


def record_execution(run_id: str, seq: int, step: str, attempt: int) -> int:
    """Called first thing by every test step body: who ran what, when. Returns how many times
    this step has run for this run, this time included (counted when recorded, so a process
    paused right after still knows which execution it is)."""
    with closing(_connect()) as conn:
        row = conn.execute(
            "INSERT INTO executions VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, seq, step, attempt, os.getpid(), time.time()),
        ).lastrowid
        (count,) = conn.execute(
            "SELECT count(*) FROM executions WHERE run_id = ? AND step = ? AND rowid <= ?",
            (run_id, step, row),
        ).fetchone()
    return int(count)


def is_released(run_id: str) -> bool:
    """Has the test released `run_id` yet (without waiting)?"""
    with closing(_connect()) as conn:
        return (
            conn.execute("SELECT 1 FROM releases WHERE run_id = ?", (run_id,)).fetchone()
            is not None
        )


def wait_for_release(run_id: str, *, timeout: float = 120.0) -> None:
    """Block until the test calls `release(run_id)` (an event it controls)."""
    deadline = time.monotonic() + timeout
    with closing(_connect()) as conn:
        while not conn.execute("SELECT 1 FROM releases WHERE run_id = ?", (run_id,)).fetchone():
            if time.monotonic() > deadline:
                raise PartnerTimeout(f"{run_id} was never released")
            time.sleep(0.02)


# --- what tests call ---------------------------------------------------------------------------
def release(run_id: str) -> None:
    with closing(_connect()) as conn:
        conn.execute("INSERT OR IGNORE INTO releases VALUES (?)", (run_id,))


def effects() -> Counter[str]:
    """Effects per key: I1 holds when every count is 1."""
    with closing(_connect()) as conn:
        return Counter(key for (key,) in conn.execute("SELECT key FROM effects"))


def requests() -> Counter[str]:
    """Requests per key, replays included."""
    with closing(_connect()) as conn:
        return Counter(key for (key,) in conn.execute("SELECT key FROM requests"))


def executions(run_id: str | None = None) -> list[dict[str, Any]]:
    """Execution rows in the order they happened, for one run or all."""
    query = "SELECT run_id, seq, step, attempt, pid, at FROM executions"
    args: tuple[str, ...] = ()
    if run_id is not None:
        query, args = f"{query} WHERE run_id = ?", (run_id,)
    with closing(_connect()) as conn:
        rows = conn.execute(f"{query} ORDER BY rowid", args).fetchall()
    fields = ("run_id", "seq", "step", "attempt", "pid", "at")
    return [dict(zip(fields, row, strict=True)) for row in rows]


def execution_counts(run_id: str | None = None) -> Counter[tuple[str, int, str]]:
    """How often each (run, seq, step) body ran."""
    return Counter((r["run_id"], r["seq"], r["step"]) for r in executions(run_id))
