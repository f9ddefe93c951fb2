"""Which workers of which build are alive (docs/deploys.md, "Builds"): each worker's main process
keeps a row with a heartbeat and, on Postgres, an advisory lock of its own, so a SIGKILLed worker is
not counted a moment after it died, on whatever host (as step owners are:
docs/protocol.md, "Liveness").

Routing reads the roster to send a pinned run's step to its build's queue only while a worker of
that build is alive, and to hold it otherwise. A worker that starts releases the runs held for
its build at once, so they do not wait for the sweeper.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from typing import Any

import psycopg
from django.db import close_old_connections, connection

from agentflow import _store as store
from agentflow._builds import routing
from agentflow._conf import settings
from agentflow._core import builds, leases, outage

logger = logging.getLogger("agentflow.roster")  # the name hosts' LOGGING knows

#: Seconds between a worker's heartbeats (`store.builds.WORKER_TTL_SECONDS` is three of them
#: and more: a worker is counted gone after missing several).
BEAT_SECONDS = 2.0

#: Held by a heartbeat for as long as its SQLite connection is open, and by `os.fork`: a prefork
#: worker forks its pool children from this very process, and a child forked while this thread
#: has SQLite open inherits SQLite's record of the file's locks without the locks themselves
#: (POSIX locks are not inherited). Believing it holds them, the child's own connection then
#: lets another process checkpoint the WAL and delete it under the child's committed writes: a
#: read step that killed its worker had its counted attempt vanish, and killed it for ever.
_sqlite_open = threading.Lock()
_fork_guarded = False


class _Presence:
    """This worker's row and lock, kept by one daemon thread of its main process."""

    def __init__(self, queue: str) -> None:
        self.build = builds.current()
        self.queue = queue
        self.name = f"{settings.AGENTFLOW_HOSTNAME}/{os.getpid()}/{secrets.token_hex(4)}"
        self.key = leases.lock_key("worker:" + self.name)
        self.conn: psycopg.Connection[Any] | None = None
        self.server = ""
        self.lock_lost = False
        self.stopped = threading.Event()
        self.released = False
        self.thread = threading.Thread(target=self._loop, name="agentflow-roster", daemon=True)

    def _lock(self) -> int | None:
        """Hold this worker's lock on a connection of its own (None: leases alone)."""
        conninfo = leases.liveness_conninfo()
        if conninfo is None:
            return None
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(conninfo, autocommit=True, prepare_threshold=None)
            row = self.conn.execute("SELECT pg_try_advisory_lock(%s)", [self.key]).fetchone()
            if not row or not row[0]:
                self.conn.close()
                self.conn = None
                return None
            server = self.conn.execute(f"SELECT {leases.SERVER_SQL}").fetchone()
            self.server = server[0] if server else ""
        else:
            self.conn.execute("SELECT 1")
        return self.key

    def beat(self) -> None:
        with _sqlite_open:
            try:
                self._beat()
            finally:
                if connection.vendor == "sqlite":
                    connection.close()  # no SQLite connection is open when the pool forks

    def _beat(self) -> None:
        close_old_connections()
        try:
            lock = self._lock()
        except Exception as exc:
            if not self.lock_lost:  # once until it is back, not once per heartbeat
                logger.warning("worker liveness connection lost (%s); heartbeat only", exc)
            self.lock_lost = True
            if self.conn is not None:
                self.conn.close()
            self.conn, lock = None, None
        else:
            if self.lock_lost and lock is not None:
                logger.info("worker liveness connection back; this worker's lock is held")
                self.lock_lost = False
        store.build_known(self.build)
        store.worker_beat(
            name=self.name, build=self.build, queue=self.queue, lock=lock, server=self.server
        )
        if not self.released:
            # A worker of this build is alive now: what was held for one goes at once.
            released = routing.release(routing.Hold(routing.BUILD, self.build))
            if released:
                logger.info("released %d runs held for build %s", len(released), self.build)
            self.released = True

    def _loop(self) -> None:
        while not self.stopped.is_set():
            try:
                self.beat()
            except Exception as exc:
                if outage.unreachable(exc):
                    outage.noticed(exc, "keeping this worker on the roster")
                else:
                    logger.exception("worker heartbeat failed; trying again")
            self.stopped.wait(BEAT_SECONDS)

    def stop(self) -> None:
        self.stopped.set()
        try:
            close_old_connections()
            store.worker_gone(self.name)
        except Exception:
            logger.exception("could not remove this worker from the roster")
        if self.conn is not None:
            self.conn.close()


def build_states() -> list[dict[str, Any]]:
    """Every build, newest first: `current` (this process's), `draining` (runs are still on it:
    keep its workers) or `drained` (none: safe to stop), with its live workers and runs."""
    own = builds.current()
    rows = []
    for row in store.builds_overview():
        state = "current" if row.id == own else ("draining" if row.active_runs else "drained")
        rows.append(
            {
                "build": row.id,
                "state": state,
                "first_seen_at": row.first_seen_at.isoformat(),
                "last_seen_at": row.last_seen_at.isoformat(),
                "workflows": row.workflows,
                "live_workers": row.live_workers,
                "active_runs": row.active_runs,
                "pinned_runs": row.pinned_runs,
                "held_runs": row.held_runs,
            }
        )
    return rows


_presence: _Presence | None = None


def join(queue: str) -> None:
    """This process is a worker consuming `queue` (its build's): keep it on the roster."""
    global _presence, _fork_guarded
    if _presence is not None:
        return
    if not _fork_guarded:
        os.register_at_fork(
            before=_sqlite_open.acquire,
            after_in_parent=_sqlite_open.release,
            after_in_child=_sqlite_open.release,
        )
        _fork_guarded = True
    _presence = _Presence(queue)
    _presence.thread.start()


def leave() -> None:
    """A warm shutdown: off the roster at once (a killed worker leaves by its lock)."""
    global _presence
    if _presence is not None:
        _presence.stop()
        _presence = None
