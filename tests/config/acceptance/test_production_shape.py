"""The production shape refuses to start unsafely, and `check --deploy` is clean when set up.

Real commands in subprocesses, as a deployment starts them: gunicorn, runserver, a Celery
worker and `manage.py check --deploy`, each with an environment of its own.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from agentflow._privacy.keys import new_master_key
from agentflow.testing.processes import free_port
from config.deployment import DEBUG_SECRET_KEY

ROOT = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
REFUSAL = "and DJANGO_DEBUG is off: refusing to start"


def environment(tmp_path: Path, **values: str | None) -> dict[str, str]:
    """This process's environment without Django's and the suite's settings, plus `values`
    (None removes a variable)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "AGENTFLOW_")) and k not in {"DATABASE_URL"}
    }
    env.update(AGENTFLOW_VAR_DIR=str(tmp_path / "var"), DJANGO_DEBUG="0")
    for key, value in values.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def start_commands() -> dict[str, list[str]]:
    port = str(free_port())
    return {
        "gunicorn": [str(BIN / "gunicorn"), "config.wsgi", "--bind", f"127.0.0.1:{port}"],
        "runserver": [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}"],
        "worker": [
            str(BIN / "celery"),
            "-A",
            "config.celery_app",
            "worker",
            "-c",
            "1",
            "-l",
            "info",
        ],
    }


@pytest.mark.parametrize("command", ["gunicorn", "runserver", "worker"])
@pytest.mark.parametrize(
    ("key", "reason"),
    [
        pytest.param(None, "DJANGO_SECRET_KEY is not set", id="no-key"),
        pytest.param(DEBUG_SECRET_KEY, "is a published default", id="default-key"),
    ],
)
def test_debug_off_without_a_real_key__web_and_worker_exit_non_zero_with_the_reason(
    tmp_path: Path, command: str, key: str | None, reason: str
) -> None:
    env = environment(tmp_path, DJANGO_SECRET_KEY=key)
    done = subprocess.run(
        start_commands()[command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    said = done.stdout + done.stderr
    assert done.returncode != 0, said[-2000:]
    assert reason in said and REFUSAL in said, said[-2000:]


@pytest.mark.parametrize("command", ["migrate", "check", "bench"])
def test_manage_py_without_a_key__says_why_in_one_line_not_a_traceback(
    tmp_path: Path, command: str
) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", command],
        cwd=ROOT,
        env=environment(tmp_path, DJANGO_SECRET_KEY=None),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode != 0 and done.stdout == ""
    assert "Traceback" not in done.stderr, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("manage.py: DJANGO_SECRET_KEY is not set") and REFUSAL in line


def production_variables() -> dict[str, str]:
    """The production variables of the manual, as documented (the key generated, as it says)."""
    page = (ROOT / "docs" / "production.md").read_text()
    block = re.search(r"<!-- production-variables -->\s*```sh\n(.*?)```", page, re.S)
    assert block, "docs/production.md documents the production variables in a marked block"
    values = dict(re.findall(r"^([A-Z_]+)=(\S*)", block.group(1), re.M))
    for secret in ("DJANGO_SECRET_KEY", "AGENTFLOW_METRICS_TOKEN", "AGENTFLOW_MASTER_KEYS"):
        assert values[secret].startswith("$(")  # generated, never written down
        values[secret] = secrets.token_urlsafe(50)
    values["AGENTFLOW_MASTER_KEYS"] = new_master_key()
    return values


def test_check_deploy__documented_production_variables_give_no_warning(tmp_path: Path) -> None:
    variables = production_variables()
    for needed in (
        "DJANGO_HTTPS",
        "DJANGO_SECURE_PROXY_SSL_HEADER",
        "DJANGO_CSRF_TRUSTED_ORIGINS",
        "DJANGO_ALLOWED_HOSTS",
        "AGENTFLOW_TRUSTED_PROXIES",
        "AGENTFLOW_METRICS_TOKEN",
    ):
        assert needed in variables
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=environment(tmp_path, **variables),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout


def test_check_deploy__without_them_it_warns(tmp_path: Path) -> None:
    """The test above can fail: the same check on the bare shape names what is missing."""
    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=environment(tmp_path, DJANGO_SECRET_KEY=secrets.token_urlsafe(50)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    for warning in (
        "security.W004",
        "security.W008",
        "security.W012",
        "security.W016",
        "agentflow.W001",
    ):
        assert warning in done.stderr
