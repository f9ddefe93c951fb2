"""The refunds app's commands under bad input: one line and a non-zero exit before anything
starts (no sandbox, worker or broker is started for an argument that cannot work)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

from agentflow.testing.processes import free_port
from tests.support.malformed import refusal


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--refunds=0"], "argument --refunds: '0' is not a whole number of 1 or more"),
        (["--rate=nan"], "argument --rate: 'nan' is not a number above 0"),
        (["--rate=0"], "argument --rate: '0' is not a number above 0"),
        (["--timeout=inf"], "argument --timeout: 'inf' is not a number above 0"),
        (["--kill-interval=-1"], "argument --kill-interval: '-1' is not a number above 0"),
        (["--postgres-restarts=-1"], "argument --postgres-restarts: '-1' is not a whole number"),
        (["--workers=" + "9" * 5000], "argument --workers: '9999"),
        (["--partner-limits={nope"], "argument --partner-limits: AGENTFLOW_PARTNER_LIMITS is not"),
        (["--partner-limits=" + "[" * 9000 + "]" * 9000], "argument --partner-limits: the JSON"),
        (["--model", "--steps=0"], "argument --steps: '0' is not a whole number of 1 or more"),
        (["--engine=llm"], "argument --engine: invalid choice: 'llm'"),
    ],
)
def test_chaos__an_argument_that_cannot_work__one_line_before_anything_starts(
    args: list[str], says: str
) -> None:
    assert refusal("chaos", *args).startswith(f"Error: {says}")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--port=70000"], "argument --port: '70000' is not a whole number from 1 to 65535"),
        (["--smtp-port=0"], "argument --smtp-port: '0' is not a whole number from 1 to 65535"),
        (["--key-window-seconds=nan"], "argument --key-window-seconds: 'nan' is not a number"),
        (["--today-offset-days=99999999"], "argument --today-offset-days: '99999999' is not"),
        (["--stripe-rate=-1"], "argument --stripe-rate: '-1' is not a whole number of 0 or more"),
    ],
)
def test_sandbox__an_argument_that_cannot_work__one_line(args: list[str], says: str) -> None:
    assert refusal("sandbox", *args).startswith(f"Error: {says}")


def test_sandbox__a_port_someone_else_holds__one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        said = refusal(
            "sandbox",
            f"--port={port}",
            f"--smtp-port={free_port()}",
            f"--state={tmp_path / 'state.sqlite3'}",
        )

    assert said.startswith("the sandbox cannot start: [Errno 98] Address already in use"), said


def test_ensure_admin__takes_no_arguments__one_line() -> None:
    assert refusal("ensure_admin", "bob") == "Error: unrecognized arguments: bob"


def test_chaos__from_a_shell__one_line_and_exit_2() -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "chaos", "--rate=nan"],
        cwd=settings.BASE_DIR,
        env={**os.environ, "AGENTFLOW_METRICS_TOKEN": "t"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "CommandError: Error: argument --rate: 'nan' is not a number above 0 "
        "(--help lists the arguments)\n"
    )
