"""Who owns a step: this process's owner token, its liveness lock, and lease renewal.

Liveness comes from the database itself (docs/protocol.md, "Liveness"): each worker process holds a
session-level Postgres advisory lock, named by its owner token, on a connection of its own. When the
process dies, on whatever host, in whatever PID namespace, Postgres ends its session and frees the
lock, so a checkpoint whose owner's lock is free is provably abandoned and is taken over at once.
Nothing here reads `/proc` or compares host names: "cannot tell" is never "dead". A host that
vanishes without closing its sockets keeps the lock until TCP keepalives end the session; its
leases run out before that. SQLite (the embedded default) has leases only.

One background thread per process keeps that connection (reconnecting and taking the lock
again whenever it breaks: a dropped connection must never end renewals) and renews the leases
of the steps running in the process, through it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import dj_database_url
import psycopg
from django.db import close_old_connections, connection

from agentflow._conf import settings
from agentflow._core import outage

logger = logging.getLogger("agentflow.leases")  # the name hosts' LOGGING knows

#: Without a step to renew, the liveness connection is checked this often, so a broken one is
#: replaced (and the lock taken again) within about this long.
PING_SECONDS = 1.0
#: How long the first claim of a process waits for its lock before claiming on a lease alone.
FIRST_LOCK_WAIT_SECONDS = 2.0


#: Which database server this is, as SQL: its system identifier (shared by a physical standby)
#: and the timeline it writes WAL on (a promoted standby starts a new one at once; the timeline
#: in `pg_control_checkpoint()` moves only at its next checkpoint, minutes later). Only a
#: primary answers: a standby takes no claims.
SERVER_SQL = (
    "((SELECT system_identifier FROM pg_control_system())::text || '/' "
    "|| substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))"
)
#: Since when a free advisory lock on this server says its owner let it go, as SQL: every lock
#: is freed when the server restarts, and also when any one of its processes crashes (an OOM
#: kill of a backend: the postmaster resets shared memory and every session with it, but
#: `pg_postmaster_start_time()` stays). Crash recovery discards the cumulative statistics, which
#: stamps `pg_stat_wal.stats_reset` (readable by any role); a reset by hand moves it too, which
#: only makes older claims wait for their leases.
LOCKS_SINCE_SQL = "GREATEST(pg_postmaster_start_time(), (SELECT stats_reset FROM pg_stat_wal))"


def lock_key(token: str) -> int:
    """The advisory lock named by an owner token: a positive 62-bit integer, so its two 32-bit
    halves (how `pg_locks` shows it) are plain non-negative numbers."""
    digest = hashlib.blake2b(token.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & ((1 << 62) - 1) or 1


def _source() -> tuple[Any, ...]:
    """What the liveness connection's address depends on (tests switch databases)."""
    db = connection.settings_dict
    return (
        settings.AGENTFLOW_LIVENESS_DATABASE_URL,
        connection.vendor,
        db.get("NAME"),
        db.get("HOST"),
        db.get("PORT"),
        db.get("USER"),
    )


def liveness_conninfo() -> str | None:
    """Where the liveness connection goes, or None for leases alone.

    `AGENTFLOW_LIVENESS_DATABASE_URL` names it (behind PgBouncer in transaction mode it must go
    to Postgres directly: a pooled session would move the lock between clients); "off" turns
    liveness off. Otherwise the default database's own settings, when it is Postgres.
    """
    url = settings.AGENTFLOW_LIVENESS_DATABASE_URL
    if url.lower() == "off":
        return None
    if url:
        db: dict[str, Any] = dict(dj_database_url.parse(url))
    elif connection.vendor == "postgresql":
        db = dict(connection.settings_dict)
    else:
        return None
    params = {
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
        "dbname": db.get("NAME") or None,
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "connect_timeout": 5,
        "application_name": "agentflow-liveness",
        # A peer that vanished without a word is noticed by TCP, not only by the lease.
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
    }
    return psycopg.conninfo.make_conninfo("", **{k: v for k, v in params.items() if v is not None})


class _Process:
    """This process's identity and liveness; rebuilt in a forked child (new pid)."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.token = f"{settings.AGENTFLOW_HOSTNAME}/{self.pid}/{secrets.token_hex(4)}"
        self.key = lock_key(self.token)
        #: Set by `owner()` (a claiming thread, which sees the database settings); None until
        #: the first claim, or for leases alone.
        self.source: tuple[Any, ...] | None = None
        self.conninfo: str | None = None
        self.conn: psycopg.Connection[Any] | None = None
        self.connected_to: str | None = None
        #: The server the lock is held on (`SERVER_SQL`), read when it was taken.
        self.server = ""
        self.held = threading.Event()
        self.first_attempt = threading.Event()
        self.last_ok = 0.0
        self.lock = threading.Lock()
        self.leases: dict[int, tuple[float, Callable[[Any], bool], Callable[[], None]]] = {}
        self.wake = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="agentflow-leases", daemon=True)
        self.thread.start()

    # --- liveness --------------------------------------------------------------------------
    def _connect(self) -> None:
        """Open the liveness connection and take this process's lock on it."""
        conninfo = self.conninfo
        assert conninfo is not None
        conn = psycopg.connect(conninfo, autocommit=True, prepare_threshold=None)
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()
        if backend is not None and backend[0] != conn.info.backend_pid:
            # A pooler answered (its backend key is its own): a session lock taken through it
            # stays on a server connection that outlives us, or goes with one that is closed
            # while we live. Leases alone, rather than a liveness that can lie.
            conn.close()
            self.conninfo = None
            logger.error(
                "the liveness connection reached Postgres through a pooler: worker liveness "
                "uses leases alone until AGENTFLOW_LIVENESS_DATABASE_URL points straight at "
                "Postgres"
            )
            return
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", [self.key]).fetchone()
        if not row or not row[0]:
            conn.close()
            raise RuntimeError(f"advisory lock {self.key} of {self.token} is held by another")
        server = conn.execute(f"SELECT {SERVER_SQL}").fetchone()
        self.server = server[0] if server else ""
        self.conn, self.connected_to = conn, conninfo
        self.last_ok = time.monotonic()
        self.held.set()
        outage.connected()

    def _drop(self) -> None:
        self.held.clear()
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # already broken: nothing to close
                logger.debug("closing a broken liveness connection failed", exc_info=True)

    def _keep_liveness(self) -> None:
        if self.conninfo is None:
            if self.conn is not None:
                self._drop()
            return
        try:
            if self.conn is not None and self.connected_to != self.conninfo:
                self._drop()  # the settings moved to another database
            if self.conn is None or self.conn.closed:
                self._drop()
                self._connect()
            elif time.monotonic() - self.last_ok >= PING_SECONDS:
                self.conn.execute("SELECT 1")
                self.last_ok = time.monotonic()
        except Exception as exc:
            if outage.unreachable(exc):
                outage.noticed(exc, "keeping this process's liveness lock")
            else:
                logger.warning("liveness connection lost (%s); reconnecting", exc)
            self._drop()
        finally:
            self.first_attempt.set()

    # --- the loop --------------------------------------------------------------------------
    def _loop(self) -> None:
        """Never ends: any error is logged and the next turn tries again (a renewer that stopped
        would let every long step of this process be taken over)."""
        while True:
            try:
                self._turn()
            except Exception as exc:
                if outage.unreachable(exc):
                    outage.noticed(exc, "renewing leases")
                else:
                    logger.exception("lease renewer turn failed; trying again")
                self._drop()
            self.wake.wait(min(interval(), 0.5))
            self.wake.clear()

    def _turn(self) -> None:
        self._keep_liveness()
        now = time.monotonic()
        with self.lock:
            due = [(token, entry) for token, entry in self.leases.items() if entry[0] <= now]
        if not due:
            return
        if self.conn is None:
            close_old_connections()  # renewals go through this thread's Django connection
        for token, (_, renew, on_lost) in due:
            try:
                kept = renew(self.conn)
                self.last_ok = time.monotonic()
            except Exception as exc:
                if outage.unreachable(exc):
                    outage.noticed(exc, "renewing leases")
                else:
                    logger.exception("lease renewal failed; will try again")
                if self.conn is not None:
                    self._drop()
                else:
                    close_old_connections()
                continue
            with self.lock:
                if token not in self.leases:
                    continue  # the step finished meanwhile
                if kept:
                    self.leases[token] = (now + interval(), renew, on_lost)
                else:
                    del self.leases[token]
            if not kept:
                on_lost()

    def owner(self) -> tuple[str, int | None, str]:
        source = _source()
        if source != self.source:
            self.source, self.conninfo = source, liveness_conninfo()
            self.first_attempt.clear()
            self.held.clear()
            self.wake.set()
        if self.conninfo is None:
            return self.token, None, ""
        self.first_attempt.wait(FIRST_LOCK_WAIT_SECONDS)
        if not self.held.is_set():
            return self.token, None, ""
        return self.token, self.key, self.server

    def release(self, timeout: float = 5.0) -> None:
        """Close the liveness connection (its lock goes with it) until the next claim."""
        self.source, self.conninfo = None, None
        self.wake.set()
        deadline = time.monotonic() + timeout
        while self.conn is not None and time.monotonic() < deadline:
            time.sleep(0.01)


_process: _Process | None = None
_process_lock = threading.Lock()


def _this_process() -> _Process:
    global _process
    current = _process
    if current is not None and current.pid == os.getpid():
        return current
    with _process_lock:
        if _process is None or _process.pid != os.getpid():
            # A forked child must not touch its parent's connection (closing it would end the
            # parent's session and free the parent's lock): it builds its own.
            _process = _Process()
        return _process


def interval() -> float:
    """How often a running step's lease is renewed: three times per lease."""
    return max(settings.AGENTFLOW_LEASE_SECONDS / 3, 0.2)


def current_owner() -> tuple[str, int | None, str]:
    """This process's owner token, and its lock key if it holds its liveness lock right now
    (None: claims fall back to the lease alone) with the server it is held on."""
    return _this_process().owner()


def owner_token() -> str | None:
    """This process's owner token if it has one yet, for log lines and spans: unlike
    `current_owner`, never starts the liveness connection."""
    current = _process
    return current.token if current is not None and current.pid == os.getpid() else None


def release() -> None:
    """Give up this process's liveness connection (tests drop their database after)."""
    if _process is not None and _process.pid == os.getpid():
        _process.release()


@contextmanager
def kept_alive(renew: Callable[[Any], bool], on_lost: Callable[[], None]) -> Iterator[None]:
    """Renew a step's lease for as long as the block runs. `renew(conn)` gets the liveness
    connection (or None: use this thread's Django connection) and returns False once the claim
    was fenced out, which calls `on_lost` (the completion would be fenced out anyway).

    A step shorter than a third of the lease costs no renewal at all: two dict operations."""
    process = _this_process()
    token = id(renew)
    with process.lock:
        process.leases[token] = (time.monotonic() + interval(), renew, on_lost)
    try:
        yield
    finally:
        with process.lock:
            process.leases.pop(token, None)
