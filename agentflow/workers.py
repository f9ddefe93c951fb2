"""Real processes on demand for `bench`, `chaos` and the crash tests: Celery workers and a
private Redis.

Each worker is a separate `celery -A agentflow worker` process group that can be killed whole
or one prefork child at a time, exactly as an OOM killer or `kill -9` would.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

import dj_database_url
import redis
from django.conf import settings
from django.db import connection


class ProcessStartError(RuntimeError):
    pass


def free_port(*, pair: bool = False) -> int:
    """A free TCP port on 127.0.0.1; with `pair`, one whose successor is free too (HTTP + SMTP).

    Chosen below the kernel's ephemeral range: the server that will bind it starts seconds
    later, and meanwhile any outgoing connection (to Postgres, Redis, ...) may take an
    ephemeral port, which made a sandbox fail with "address already in use".
    """
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10_000, max(10_002, low - 1))
        if _bindable(port) and (not pair or _bindable(port + 1)):
            return port
    raise ProcessStartError("no free port (pair)" if pair else "no free port")


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class RedisServer:
    """A private `redis-server` that keeps nothing across a restart (`--save ''`, no AOF):
    what a broker without persistence loses, a test or the chaos run can make it lose."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        binary = shutil.which("redis-server")
        if binary is None:
            raise ProcessStartError("redis-server is not installed (apt-get install redis-server)")
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.workdir), "--daemonize", "no",
                "--logfile", str(self.workdir / "redis.log")]  # fmt: skip
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 15
        while not self._pong():
            if time.monotonic() > deadline:
                raise ProcessStartError(f"redis-server on port {self.port} not ready in 15 s")
            time.sleep(0.05)
        return self

    def _pong(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessStartError(f"redis-server exited: see {self.workdir / 'redis.log'}")
        try:
            return bool(self.client().ping())
        except redis.ConnectionError:
            return False

    def kill(self) -> None:
        """SIGKILL: nothing is saved, whatever was queued or unacknowledged is gone."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """Kill and start again on the same port, empty: every message is lost."""
        self.kill()
        self.start()

    def queue_length(self, queue: str = "celery") -> int:
        return int(self.client().llen(queue))

    def queued_messages(self, queue: str = "celery") -> list[Any]:
        return list(self.client().lrange(queue, 0, -1))


def current_database_url() -> str:
    """This process's effective Postgres database as a URL a worker can use.

    Under pytest that is the test database (pytest-django renames it), not the one
    DATABASE_URL names. Raises ValueError on other databases: several worker processes
    writing at once need Postgres.
    """
    db = connection.settings_dict
    if db["ENGINE"] != "django.db.backends.postgresql":
        raise ValueError(f"worker processes need Postgres, not {db['ENGINE'].rsplit('.', 1)[-1]}")
    configured = os.environ.get("DATABASE_URL", "")
    if configured and dj_database_url.parse(configured).get("NAME") == db["NAME"]:
        return configured  # unchanged, with any options it carries
    auth = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        auth += ":" + quote(db["PASSWORD"], safe="")
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgres://{auth}@{db['HOST'] or 'localhost'}{port}/{quote(db['NAME'], safe='')}"


def _children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


class WorkerProcess:
    """One `celery worker` (a parent plus its prefork children) with its log in a file."""

    def __init__(
        self,
        *,
        concurrency: int = 1,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        log_dir: Path | None = None,
        beat: bool = False,
        extra_args: list[str] | None = None,
        wrapper: list[str] | None = None,
    ) -> None:
        """`wrapper`: a command the worker runs under, e.g. `unshare --pid --fork --mount-proc`
        for a PID namespace of its own (its pool children are then the wrapped worker's)."""
        self.name = name or f"w{uuid.uuid4().hex[:8]}"
        self.wrapper = wrapper or []
        self.concurrency = concurrency
        self.env = {**os.environ, **(env or {})}
        self.env.setdefault("DJANGO_SETTINGS_MODULE", "agentflow.settings")
        self.beat = beat
        self.extra_args = extra_args or []
        log_dir = log_dir or Path(settings.VAR_DIR) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout: float = 30.0) -> WorkerProcess:
        args = [
            *self.wrapper,
            sys.executable, "-m", "celery", "-A", "agentflow", "worker",
            "-P", "prefork", "-c", str(self.concurrency), "-n", f"{self.name}@%h",
            "--without-mingle", "--without-gossip", "-l", "info",
            *(["-B", "-s", str(self.log_path.with_suffix(".beat"))] if self.beat else []),
            *self.extra_args,
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: killpg reaches every child
                cwd=settings.BASE_DIR,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ProcessStartError(f"worker {self.name} exited: {self.log_tail()}")
            if (
                b" ready." in self.log_path.read_bytes()
                and len(self.children()) >= self.concurrency
            ):
                return self
            time.sleep(0.05)
        self.kill()
        raise ProcessStartError(f"worker {self.name} not ready in {timeout} s: {self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None, "worker not started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def children(self) -> list[int]:
        """Pids of the prefork pool processes (as this host's root namespace numbers them)."""
        if not self.alive():
            return []
        main = self.pid
        if self.wrapper:
            wrapped = _children_of(main)
            if not wrapped:
                return []
            main = wrapped[0]
        return _children_of(main)

    def kill_child(self, pid: int | None = None) -> int:
        """SIGKILL one pool process (the first, or `pid`); the parent replaces it."""
        victims = [pid] if pid else self.children()[:1]
        if not victims:
            raise RuntimeError(f"worker {self.name} has no children to kill")
        os.kill(victims[0], signal.SIGKILL)
        return victims[0]

    def kill(self) -> None:
        """SIGKILL the whole worker: parent and children, no shutdown handlers run."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, *, timeout: float = 15.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL if it takes too long."""
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.kill()
