"""The processes a chaos run owns: a private broker (Redis or RabbitMQ), the partner sandbox,
Celery beat and, to be asked what people see during a database outage, a web process.

Each is started in its own process group with its log in the run's directory, and can be killed
with SIGKILL exactly as an OOM killer would. Workers come from `agentflow.testing.processes`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

from django.conf import settings

from agentflow.testing.processes import (
    ProcessStartError,
    RabbitMQServer,
    RedisServer,
    free_port,
)
from refunds.sandbox import airline


def _wait(ready: Callable[[], bool], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise ProcessStartError(f"{what} not ready in {timeout} s")
        time.sleep(0.05)


def _spawn(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            args,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: Ctrl-C in the terminal is ours
            cwd=settings.BASE_DIR,
        )


def _kill_group(proc: subprocess.Popen | None) -> None:
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


class RedisBroker(RedisServer):
    """The chaos run's private broker, which can also tell what a restart would lose."""

    def queued_steps(self) -> list[tuple[str, int]]:
        """(run id, seq) of every step message in the queue or held unacknowledged by a worker:
        exactly what a restart loses."""
        client = self.client()
        raw = list(client.lrange("celery", 0, -1))
        raw += [json.loads(v)[0] for v in client.hvals("unacked")]  # kombu: [message, ex, rk]
        found = []
        for item in raw:
            message = json.loads(item) if isinstance(item, bytes | str) else item
            args = _step_args(message)
            if args is not None:
                found.append(args)
        return found


class RabbitBroker(RabbitMQServer):
    """The chaos run's private RabbitMQ node. Its queue is durable and its messages
    persistent (Celery's defaults), so a restart gives back what the node had written to disk,
    and the messages its consumers held unacknowledged become ready again."""

    def queued_steps(self) -> list[tuple[str, int]]:
        """Not read: a RabbitMQ queue cannot be listed without taking its messages. What a
        restart lost shows as runs the sweeper had to re-publish."""
        return []


def _step_args(message: dict[str, Any]) -> tuple[str, int] | None:
    headers = message.get("headers") or {}
    if headers.get("task") != "agentflow.run_step":
        return None
    try:
        body = json.loads(base64.b64decode(message["body"]))
        run_id, seq = body[0][:2]
        return str(run_id), int(seq)
    except (KeyError, ValueError, TypeError, IndexError):
        return None


def airline_today() -> date:
    """The chaos sandbox's today (it starts with this site's SANDBOX_TODAY_OFFSET_DAYS): what
    the customers' days are counted from."""
    return airline.today(offset_days=settings.SANDBOX_TODAY_OFFSET_DAYS)


class Sandbox:
    """`manage.py sandbox` on free ports with a fresh state file, plus its control API."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port(pair=True)
        self.smtp_port = self.port + 1
        self.state = workdir / "sandbox.sqlite3"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, env: dict[str, str]) -> Sandbox:
        args = [
            sys.executable,
            "manage.py",
            "sandbox",
            "--port",
            str(self.port),
            "--smtp-port",
            str(self.smtp_port),
            "--state",
            str(self.state),
            "--today-offset-days",
            str(settings.SANDBOX_TODAY_OFFSET_DAYS),
        ]
        self.proc = _spawn(args, self.workdir / "sandbox.log", env)
        _wait(self._healthy, timeout=30, what=f"sandbox on port {self.port}")
        return self

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessStartError(f"sandbox exited: see {self.workdir / 'sandbox.log'}")
        try:
            return self.call("GET", "/_sandbox/health").get("status") == "ok"
        except (OSError, ValueError):
            return False

    def call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def arm(self, faults: list[dict[str, Any]]) -> None:
        for fault in faults:
            try:
                self.call("POST", "/_sandbox/faults", fault)
            except urllib.error.HTTPError as exc:
                raise ProcessStartError(f"sandbox refused fault {fault}: {exc.read()!r}") from exc

    def ledger(self) -> dict[str, Any]:
        return self.call("GET", "/_sandbox/ledger")

    def kill(self) -> None:
        _kill_group(self.proc)
        self.proc = None


class Beat:
    """One `celery beat`: the sweeper's clock, never killed, so exactly one is ever running."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir, self.env = workdir, env
        self.proc: subprocess.Popen | None = None

    def start(self) -> Beat:
        args = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config.celery_app",
            "beat",
            "-l",
            "info",
            "-s",
            str(self.workdir / "celerybeat-schedule"),
        ]
        self.proc = _spawn(args, self.workdir / "beat.log", self.env)
        return self

    def kill(self) -> None:
        _kill_group(self.proc)
        self.proc = None


class Web:
    """`gunicorn config.wsgi` on a free port: what operators and customers reach during a
    database outage (the run's own traffic goes through the form in-process)."""

    def __init__(self, workdir: Path, env: dict[str, str], *, workers: int = 2) -> None:
        self.workdir, self.env, self.workers = workdir, env, workers
        self.port = free_port()
        self.log_path = workdir / "web.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Web:
        args = [
            sys.executable,
            "-m",
            "gunicorn",
            "config.wsgi",
            "--no-control-socket",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(self.workers),
        ]
        self.proc = _spawn(args, self.log_path, self.env)
        _wait(self._answers, timeout=60, what=f"gunicorn on port {self.port}")
        return self

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessStartError(f"gunicorn exited: see {self.log_path}")
        try:
            with urllib.request.urlopen(f"{self.url}/refunds/new/", timeout=5) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        _kill_group(self.proc)
        self.proc = None
