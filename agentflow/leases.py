"""Who owns a step: lease owner names, same-host liveness checks, and lease renewal."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache

from django.conf import settings
from django.db import close_old_connections

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


class _Renewer:
    """One background thread per process renews the leases of the steps running in it.

    A step registers on start and leaves on finish: two dict operations, no thread start, and
    no commit at all for a step shorter than a third of the lease. A renewal that finds the step
    taken over calls the step's `on_lost`; its completion would be fenced out anyway.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._leases: dict[int, tuple[float, Callable[[], bool], Callable[[], None]]] = {}
        self._pid: int | None = None
        self._wake = threading.Event()

    @staticmethod
    def interval() -> float:
        return max(settings.AGENTFLOW_LEASE_SECONDS / 3, 0.2)

    def track(self, token: int, renew: Callable[[], bool], on_lost: Callable[[], None]) -> None:
        with self._lock:
            if self._pid != os.getpid():  # first use in this (forked) process
                self._pid = os.getpid()
                self._leases = {}
                threading.Thread(target=self._loop, name="lease-renewer", daemon=True).start()
            self._leases[token] = (time.monotonic() + self.interval(), renew, on_lost)

    def untrack(self, token: int) -> None:
        with self._lock:
            self._leases.pop(token, None)

    def _loop(self) -> None:
        while True:
            self._wake.wait(min(self.interval(), 0.5))
            now = time.monotonic()
            with self._lock:
                due = [(token, entry) for token, entry in self._leases.items() if entry[0] <= now]
            if not due:
                continue
            close_old_connections()
            for token, (_, renew, on_lost) in due:
                try:
                    kept = renew()
                except Exception:
                    logger.exception("lease renewal failed; will try again")
                    kept = True
                with self._lock:
                    if token not in self._leases:
                        continue  # the step finished meanwhile
                    if kept:
                        self._leases[token] = (now + self.interval(), renew, on_lost)
                    else:
                        del self._leases[token]
                if not kept:
                    on_lost()


_renewer = _Renewer()


@contextmanager
def kept_alive(renew: Callable[[], bool], on_lost: Callable[[], None]) -> Iterator[None]:
    """Renew a step's lease for as long as the block runs."""
    token = id(renew)
    _renewer.track(token, renew, on_lost)
    try:
        yield
    finally:
        _renewer.untrack(token)
