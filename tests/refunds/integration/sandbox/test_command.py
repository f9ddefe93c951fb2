"""`manage.py sandbox` listens where the workers will send mail."""

from __future__ import annotations

import os
import signal
import smtplib
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentflow.testing.processes import free_port
from agentflow.testing.waiting import wait_for
from refunds.sandbox import airline

ROOT = Path(__file__).resolve().parents[4]


@contextmanager
def sandbox_command(tmp_path: Path, *args: str, **env: str) -> Iterator[Path]:
    log = tmp_path / "sandbox.log"
    environ = {k: v for k, v in os.environ.items() if k != "SANDBOX_SMTP_PORT"}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "sandbox", "--state", str(tmp_path / "s.sqlite3"), *args],
            cwd=ROOT,
            env={**environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: "Partner sandbox:" in log.read_text() or process.poll() is not None,
            timeout=30,
            what="the sandbox to say where it listens",
        )
        assert process.poll() is None, log.read_text()
        yield log
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=15)


def smtp_answers(port: int) -> bool:
    with smtplib.SMTP("127.0.0.1", port, timeout=5) as smtp:
        return smtp.noop()[0] == 250


def test_sandbox__explicit_smtp_port_variable_wins_over_port_plus_one(tmp_path: Path) -> None:
    http_port, smtp_port = free_port(pair=True), free_port()
    with sandbox_command(
        tmp_path, "--port", str(http_port), SANDBOX_SMTP_PORT=str(smtp_port)
    ) as log:
        assert f"SMTP 127.0.0.1:{smtp_port}," in log.read_text()
        assert smtp_answers(smtp_port)


def test_sandbox__without_the_variable_smtp_is_port_plus_one(tmp_path: Path) -> None:
    http_port = free_port(pair=True)
    with sandbox_command(tmp_path, "--port", str(http_port)) as log:
        assert f"SMTP 127.0.0.1:{http_port + 1}," in log.read_text()
        assert smtp_answers(http_port + 1)


def test_sandbox__the_airline_s_today_runs_as_far_ahead_as_the_setting_says(
    tmp_path: Path,
) -> None:
    """SANDBOX_TODAY_OFFSET_DAYS moves the airline's calendar; `--today-offset-days` wins."""
    a_year_on = airline.today(offset_days=365)  # computed as the sandbox computes it
    with sandbox_command(
        tmp_path, "--port", str(free_port(pair=True)), SANDBOX_TODAY_OFFSET_DAYS="365"
    ) as log:
        assert f"the airline's today is {a_year_on.isoformat()})" in log.read_text()
    with sandbox_command(
        tmp_path,
        "--port",
        str(free_port(pair=True)),
        "--today-offset-days",
        "0",
        SANDBOX_TODAY_OFFSET_DAYS="365",
    ) as log:
        assert f"the airline's today is {airline.today().isoformat()})" in log.read_text()
