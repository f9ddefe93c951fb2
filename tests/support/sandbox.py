"""The `sandbox` fixture: a real partner-sandbox process (`manage.py sandbox`) for the session.

Use it from any test:

    def test_something(clean_sandbox):          # reset first (ledger, keys, faults all empty)
        client = stripe.StripeClient("sk_test_x", base_addresses={"api": clean_sandbox.url})
        ...
        assert len(clean_sandbox.ledger(workflow_id="wf")["payments"]) == 1

`sandbox` (session scope) and `clean_sandbox` (function scope, resets before the test) yield a
`SandboxProcess`:
- `url`: the HTTP base, e.g. `http://127.0.0.1:41234` (Stripe base address, airline, CRM, control);
- `smtp_port`: the SMTP sink's port on 127.0.0.1; `state_path`: the SQLite state file;
- `ledger(workflow_id=None)`: `GET /_sandbox/ledger` as a dict (filtered to one workflow if given);
- `set_fault(**kw)`: `POST /_sandbox/faults` with kw as JSON, e.g.
  `set_fault(endpoint="payment_intents.create", drop_rate=1, count=1)` or
  `set_fault(unknown_bookings=["ABC123"])`, or a barrier on a read,
  `set_fault(endpoint="airline.booking", barrier=2, count=2)`: each of the next two requests
  is held until both are (or `barrier_timeout_ms`, 30 s by default, passes); returns the armed
  faults and how many requests each endpoint holds right now (`held`);
- `clear_faults()`, `reset()`: `DELETE /_sandbox/faults`, `POST /_sandbox/reset` (both let
  every held request go);
- `restart()`: SIGKILL the process and start it again on the same ports and state file.
Its airline's today is this site's SANDBOX_TODAY_OFFSET_DAYS after the real date, read at start
(`tests.support.airline_days` counts the days tests ask for from it).
`start_sandbox(directory, ...)` starts a separate one (e.g. with `key_window_seconds=1`); stop it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from django.conf import settings

from agentflow.testing.processes import free_port
from agentflow.testing.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


class SandboxProcess:
    """One `manage.py sandbox` subprocess and a small client for its control endpoints."""

    def __init__(
        self,
        *,
        state_path: Path,
        log_path: Path,
        key_window_seconds: float | None = None,
        authorization_seconds: float | None = None,
    ) -> None:
        self.port = free_port(pair=True)
        self.smtp_port = self.port + 1
        self.url = f"http://127.0.0.1:{self.port}"
        self.state_path = state_path
        self.log_path = log_path
        self.key_window_seconds = key_window_seconds
        self.authorization_seconds = authorization_seconds
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [
            sys.executable,
            "manage.py",
            "sandbox",
            "--port",
            str(self.port),
            "--smtp-port",
            str(self.smtp_port),
            "--state",
            str(self.state_path),
            "--today-offset-days",
            str(settings.SANDBOX_TODAY_OFFSET_DAYS),
        ]
        if self.key_window_seconds is not None:
            command += ["--key-window-seconds", str(self.key_window_seconds)]
        if self.authorization_seconds is not None:
            command += ["--authorization-seconds", str(self.authorization_seconds)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        wait_for(self._healthy, timeout=30, what=f"sandbox health at {self.url}")

    def _healthy(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"sandbox exited: {self.log_path.read_text()[-2000:]}")
        try:
            return self._call("GET", "/_sandbox/health") == {"status": "ok"}
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM (the clean stop a user's Ctrl-C gives), SIGKILL if it hangs."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None

    def restart(self) -> None:
        """Kill -9 (no chance to clean up) and start again on the same ports and state file."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.start()

    def ledger(self, workflow_id: str | None = None) -> dict[str, Any]:
        query = f"?{urlencode({'workflow_id': workflow_id})}" if workflow_id is not None else ""
        return self._call("GET", f"/_sandbox/ledger{query}")

    def set_fault(self, **spec: Any) -> dict[str, Any]:
        return self._call("POST", "/_sandbox/faults", spec)

    def clear_faults(self) -> None:
        self._call("DELETE", "/_sandbox/faults")

    def reset(self) -> None:
        self._call("POST", "/_sandbox/reset")

    def set_limits(self, **spec: Any) -> dict[str, Any]:
        """Play limited partners: `stripe={"rate": 5}`, `airline={"concurrency": 3}`."""
        return self._call("POST", "/_sandbox/limits", spec)

    def limits_report(self) -> dict[str, Any]:
        """Per partner: requests, 429s, the most in any second and in flight."""
        return self._call("GET", "/_sandbox/limits")

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())


def start_sandbox(
    directory: Path,
    *,
    key_window_seconds: float | None = None,
    authorization_seconds: float | None = None,
) -> SandboxProcess:
    """Start a sandbox whose state and log live in `directory`; the caller must `stop()` it.
    `authorization_seconds` shortens how long a card hold lasts (Stripe: 7 days)."""
    directory.mkdir(parents=True, exist_ok=True)
    server = SandboxProcess(
        state_path=directory / "sandbox.sqlite3",
        log_path=directory / "sandbox.log",
        key_window_seconds=key_window_seconds,
        authorization_seconds=authorization_seconds,
    )
    server.start()
    return server


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    """The session's sandbox process (see the module docstring for its API)."""
    server = start_sandbox(tmp_path_factory.mktemp("sandbox"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def clean_sandbox(sandbox: SandboxProcess) -> SandboxProcess:
    """The session's sandbox, reset: empty ledger, no keys, no faults."""
    sandbox.reset()
    return sandbox


@pytest.fixture
def partners(settings: Any, clean_sandbox: SandboxProcess) -> SandboxProcess:
    """Point this process's partner settings at the session sandbox (real SMTP, not locmem):
    for tests that run refund steps or tools here."""
    settings.SANDBOX_URL = clean_sandbox.url
    settings.STRIPE_API_BASE = clean_sandbox.url
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = clean_sandbox.smtp_port
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    return clean_sandbox
