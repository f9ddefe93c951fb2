"""Who owns a step: lease owner names, same-host liveness checks, and lease renewal."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from functools import cache

from django.conf import settings
from django.db import close_old_connections, connection

logger = logging.getLogger(__name__)


def _process_start_ticks(pid: int) -> str | None:
    """The kernel's start time of `pid`, so a recycled pid is not mistaken for the owner."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        return fields[19].decode()
    except (OSError, IndexError):
        return None


@cache
def _owner_for(pid: int) -> str:
    return f"{settings.AGENTFLOW_HOSTNAME}/{pid}/{_process_start_ticks(pid) or '?'}"


def current_owner() -> str:
    """`host/pid/start`: unique per process, and checkable by a peer on the same host."""
    return _owner_for(os.getpid())


def owner_is_dead(owner: str) -> bool:
    """True only when `owner` is provably gone: a process on this host that no longer exists.

    Owners on other hosts are never judged dead here; their leases simply run out.
    """
    try:
        host, pid_text, start = owner.split("/")
        pid = int(pid_text)
    except ValueError:
        return False
    if host != settings.AGENTFLOW_HOSTNAME or pid == os.getpid():
        return False
    ticks = _process_start_ticks(pid)
    if ticks is None:
        return True
    if start != "?" and ticks != start:
        return True  # the pid was recycled by another process
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return True
    return state in (b"Z", b"X")  # a zombie never finishes its step


class LeaseKeeper:
    """Renews a step's lease from a background thread while the step runs.

    Short steps finish before the first renewal and cost no extra commit. When a renewal finds
    the step taken over, `on_lost` is called so the step can stop early; its completion would be
    fenced out anyway.
    """

    def __init__(self, renew: Callable[[], bool], on_lost: Callable[[], None]) -> None:
        self._renew = renew
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._interval = max(settings.AGENTFLOW_LEASE_SECONDS / 3, 0.2)
        self._thread = threading.Thread(target=self._loop, name="lease-keeper", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        used_db = False
        try:
            while not self._stop.wait(self._interval):
                used_db = True
                close_old_connections()
                try:
                    if not self._renew():
                        self._on_lost()
                        return
                except Exception:
                    logger.exception("lease renewal failed; will try again")
        finally:
            if used_db:
                connection.close()
