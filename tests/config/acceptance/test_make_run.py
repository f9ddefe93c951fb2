"""`make run` on the embedded default (SQLite, filesystem broker, no server) finishes work."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from agentflow.testing.processes import free_port
from agentflow.testing.waiting import wait_for
from refunds.sandbox.airline import owner_of

REPO = Path(__file__).resolve().parents[3]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


@pytest.fixture
def stack(tmp_path: Path, request: pytest.FixtureRequest):
    """`make run` in its own process group, on a private var dir and free ports, with no
    configuration at all: no database, broker, secret key or DEBUG from the test's own (a test
    may add some, e.g. `REFUNDS_ENGINE`, through indirect parametrisation)."""
    web_port, sandbox_port = free_port(), free_port(pair=True)  # the sandbox's SMTP is + 1
    while web_port in (sandbox_port, sandbox_port + 1):
        web_port = free_port()
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in {
            "DATABASE_URL",
            "CELERY_BROKER_URL",
            "REDIS_URL",
            "DJANGO_SETTINGS_MODULE",
            "DJANGO_SECRET_KEY",
            "DJANGO_DEBUG",
            "PROMETHEUS_MULTIPROC_DIR",  # the suite's own (its settings set it): var/metrics here
        }
    }
    env.update(
        PORT=str(web_port),
        AGENTFLOW_VAR_DIR=str(tmp_path / "var"),
        SANDBOX_URL=f"http://127.0.0.1:{sandbox_port}",
        PYTHONUNBUFFERED="1",
        **getattr(request, "param", {}),
    )
    # What a checkout that ran before looks like: var/ and a file in it readable by all.
    (tmp_path / "var").mkdir(mode=0o755)
    (tmp_path / "var" / "leftover.log").write_text("an earlier run's file\n")
    os.chmod(tmp_path / "var" / "leftover.log", 0o644)
    log_path = tmp_path / "make-run.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            ["make", "--no-print-directory", "run"],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{web_port}"
    try:
        wait_for(
            lambda: _get(f"{base}/healthz")[0] == 200 or proc.poll() is not None,
            timeout=180,
            what="the web process to answer /healthz",
        )
        assert proc.poll() is None, log_path.read_text()
        # The key `make run` made for this checkout: what a command run beside it needs too.
        key = (tmp_path / "var" / "secret-key.txt").read_text().strip()
        yield {
            "base": base,
            "env": {**env, "DJANGO_SECRET_KEY": key},
            "var": tmp_path / "var",
            "proc": proc,
            "log": log_path,
        }
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C sends to the terminal's group
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _submit_refund_form(base: str) -> str:
    """What a customer does: open the form, fill it in, send it; returns the status page URL."""
    cookies = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(cookies), _NoRedirect())
    form = opener.open(f"{base}/refunds/new/", timeout=10).read().decode()
    hidden = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form))
    owner = owner_of("MKR123")
    data = urllib.parse.urlencode(
        {
            **hidden,
            "booking_reference": "MKR123",
            "last_name": owner.last_name,
            "email": owner.email,
            "message": "Please move me to the evening flight on the same day.",
        }
    ).encode()
    try:
        opener.open(f"{base}/refunds/new/", data=data, timeout=10)
    except urllib.error.HTTPError as redirect:
        assert redirect.code == 303, redirect.read()[:500]
        return urllib.parse.urljoin(base, redirect.headers["Location"])
    raise AssertionError("the form did not answer 303")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _get_json(url: str) -> dict:
    status, body = _get(url)
    return json.loads(body) if status == 200 else {"status": f"http {status}"}


def _run_status(var: Path, run_id: str) -> tuple[str, str | None]:
    with sqlite3.connect(var / "agentflow.sqlite3", timeout=30) as db:
        row = db.execute(
            "SELECT status, output FROM agentflow_workflowrun WHERE id = ?", (run_id,)
        ).fetchone()
    return row if row else ("", None)


def test_make_run__completes_a_demo_run_and_a_refund_then_stops_on_ctrl_c(stack) -> None:
    log = stack["log"].read_text()
    assert "Admin login: admin / " in log
    assert f"{stack['base']}/refunds/new/" in log or "/refunds/new/" in log

    started = subprocess.run(
        [sys.executable, "manage.py", "start_workflow", "demo", "--input", '{"name": "make run"}'],
        cwd=REPO,
        env=stack["env"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        umask=0o077,  # as `make run` runs its own commands (this one counts a started run)
    )
    run_id = started.stdout.strip().splitlines()[-1]
    assert run_id.startswith("wf_")

    _, output = wait_for(
        lambda: (result := _run_status(stack["var"], run_id))[0] == "COMPLETED" and result,
        timeout=60,
        what=f"run {run_id} to complete",
    )
    assert json.loads(output)["greeting"] == "hello, make run"

    status_code, _ = _get(f"{stack['base']}/admin/login/")
    assert status_code == 200

    status_url = _submit_refund_form(stack["base"])
    final = wait_for(
        lambda: (state := _get_json(f"{status_url}status.json"))["status"] == "COMPLETED" and state,
        timeout=90,
        what="the refund submitted through the form to complete",
    )
    # The graph refund's 13 steps (v4 added the fee-waiver step, which asks nobody when the
    # customer asked for no waiver).
    assert [step["status"] for step in final["steps"]] == ["COMPLETED"] * 13
    _assert_private(stack["var"])
    # The access log saw every poll of the status page, yet names neither it nor the customer.
    log = stack["log"].read_text()
    assert "gunicorn.access" in log and "/status.json" in log
    assert final["id"] not in log and owner_of("MKR123").email not in log

    # Quiet by default: readable lines, none per sweep tick, Celery task or step that went to
    # plan; the refund's run shows up by its id (started in web, completed in the worker).
    done = f"run {final['workflow_id']} completed"
    console = wait_for(
        lambda: done in (text := stack["log"].read_text()) and text,
        timeout=30,
        what="the run's last line",
    )
    for noise in ("Sending due task", "] received", "succeeded in", " took "):
        assert noise not in console, noise
    [started] = [line for line in console.splitlines() if "of refund started" in line]
    assert final["workflow_id"] in started and '"event"' not in started  # text, not JSON

    proc = stack["proc"]
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=40) is not None
    with pytest.raises(ProcessLookupError):
        wait_for(lambda: _group_gone(proc.pid), timeout=20, what="every child to exit")
        os.killpg(proc.pid, 0)


def _assert_private(var: Path) -> None:
    """var/ and everything in it (the SQLite database and its WAL, the sandbox's state, the
    metrics files, the key, the broker's queue) are the owner's alone: 0700 and 0600."""
    made = {path.name for path in var.iterdir()}
    assert {"agentflow.sqlite3", "sandbox.sqlite3", "secret-key.txt", "metrics", "broker"} <= made
    loose = {
        str(path.relative_to(var)): oct(path.stat().st_mode & 0o777)
        for path in (var, *var.rglob("*"))
        if path.stat().st_mode & 0o077
    }
    assert loose == {}
    assert var.stat().st_mode & 0o777 == 0o700


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("stack", [{"REFUNDS_ENGINE": "agent"}], indirect=True)
def test_make_run__agent_engine__a_refund_through_the_form_completes_offline(stack) -> None:
    """`REFUNDS_ENGINE=agent make run`: the same form, the refund handled by the agent with
    the scripted planner (no model server, no network)."""
    status_url = _submit_refund_form(stack["base"])
    final = wait_for(
        lambda: (state := _get_json(f"{status_url}status.json"))["status"] == "COMPLETED" and state,
        timeout=120,
        what="the agent's refund to complete",
    )
    names = [step["name"] for step in final["steps"]]
    assert names[:3] == ["verify_ownership", "check_flight", "llm"] and "charge_customer" in names
    assert all(step["status"] == "COMPLETED" for step in final["steps"])


def _processes_of(var: Path, needle: str) -> list[int]:
    """This stack's processes whose command line holds `needle` (other suites' stacks run
    beside it: each has its own var directory in its environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        command = b" ".join(argv).decode(errors="replace")
        supervisor = os.path.basename(argv[0]) in (b"sh", b"dash", b"bash")  # the restart loop
        if needle in command and not supervisor and f"AGENTFLOW_VAR_DIR={var}".encode() in environ:
            found.append(int(entry.name))
    return found


def test_make_run__a_worker_and_beat_killed_with_sigkill_are_started_again(stack) -> None:
    """`kill -9` of the worker (parent and pool) and of beat, as a reader of the README tries:
    `make run` starts both again, and a run started after completes on them."""
    var, log = stack["var"], stack["log"]
    for name in ("worker", "beat"):
        needle = f"config.celery_app {name}"
        pids = wait_for(lambda n=needle: _processes_of(var, n), timeout=60, what=f"the {name}")
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda n=name: f"{n} exited (status 137): starting it again" in log.read_text(),
            timeout=30,
            what=f"make run to start the {name} again",
        )
        wait_for(
            lambda n=needle, old=set(pids): set(_processes_of(var, n)) - old,
            timeout=60,
            what=f"a new {name}",
        )
    started = subprocess.run(
        [sys.executable, "manage.py", "start_workflow", "demo", "--input", '{"name": "again"}'],
        cwd=REPO,
        env=stack["env"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        umask=0o077,
    )
    run_id = started.stdout.strip().splitlines()[-1]
    wait_for(
        lambda: _run_status(var, run_id)[0] == "COMPLETED",
        timeout=90,
        what=f"run {run_id} to complete on the new worker",
    )
    assert stack["proc"].poll() is None, log.read_text()[-3000:]
