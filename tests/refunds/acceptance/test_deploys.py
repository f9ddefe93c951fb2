"""A deploy while refunds wait for an operator (docs/deploys.md, "Builds", issue 26), from two trees
side by side: build A is this checkout, build B a copy whose refund workflow gained a read step just
before the fee (v5), build C a copy that renamed a step the runs have passed. Real web (gunicorn),
real workers and beat of each build, one database, one broker, the real sandbox's ledger.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.admin.utils import quote
from django.test import Client

from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.testing.processes import WorkerProcess
from agentflow.testing.waiting import wait_for
from refunds.agent import prompts
from refunds.models import RefundRequest
from tests.support.refunds import finished, holds_left, money_kept, partner_effects, submit
from tests.support.refunds import refund_worker_env as worker_env
from tests.support.sandbox import SandboxProcess
from tests.support.stack import ROOT, BeatProcess, WebProcess

pytestmark = pytest.mark.django_db(transaction=True)

DETAILS = "My mother died on Monday; the funeral is on the day of my flight."
IGNORED = shutil.ignore_patterns(
    ".git", ".venv", ".nox", "var", "__pycache__", "node_modules", ".*_cache", "_build"
)
NEW_STEP = "confirm_fee_schedule"


def tree(
    base: Path, name: str, edit: Callable[[str], str], module: str = "refunds/workflows.py"
) -> Path:
    """A copy of this checkout with one module edited: another release's code."""
    dest = base / name
    shutil.copytree(ROOT, dest, ignore=IGNORED)
    path = dest / module
    before = path.read_text()
    path.write_text(edit(before))
    assert path.read_text() != before
    return dest


def fee_schedule_step(source: str) -> str:
    """Build B: a new read step just before the fee, as the domain's next change would be."""
    source, bumped = re.subn(
        r'(durable\.Workflow\(\s*"refund",\s*version=)4,', r"\g<1>5,", source, count=1
    )
    assert bumped == 1, "the refund workflow's version=4 is not where build B bumps it"
    anchor = 'refund.step("calculate_penalty_fee"'
    assert anchor in source
    return source.replace(
        anchor,
        f'refund.step("{NEW_STEP}", kind="read")(lambda ctx: {{"schedule": "standard"}})\n'
        + anchor,
        1,
    )


def renamed_booking_step(source: str) -> str:
    """Build C: renames `fetch_booking`, which every waiting run has passed."""
    return source.replace('refund.step("fetch_booking"', 'refund.step("fetch_booking_v2"', 1)


#: Build D: the refund agent's system prompt says one more thing.
PROMPT_LINE = "Answer in one short paragraph."


def prompt_changed(source: str) -> str:
    return source.replace('SYSTEM_PROMPT = """\\\n', f'SYSTEM_PROMPT = """\\\n{PROMPT_LINE}\n', 1)


def deploy_check(where: Path, env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """`manage.py agentflow_deploy_check --json` with that tree's code."""
    done = subprocess.run(
        [sys.executable, "manage.py", "agentflow_deploy_check", "--json"],
        cwd=where,
        env={**os.environ, **env, "PYTHONPATH": str(where)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout, done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


class Stack:
    """The processes this test starts; every one SIGKILLed at teardown."""

    def __init__(self, sandbox: SandboxProcess, logs: Path) -> None:
        self.sandbox = sandbox
        self.logs = logs
        self.started: list[Any] = []

    def env(self, build: str, where: Path, engine: str = "graph") -> dict[str, str]:
        return worker_env(
            self.sandbox,
            AGENTFLOW_BUILD_ID=build,
            PYTHONPATH=str(where),
            REFUNDS_ENGINE=engine,
            AGENTFLOW_SWEEP_INTERVAL="1",
        )

    def worker(self, build: str, where: Path, engine: str = "graph") -> WorkerProcess:
        worker = WorkerProcess(
            concurrency=2,
            env=self.env(build, where, engine),
            cwd=where,
            name=f"w{build}",
            log_dir=self.logs,
        )
        self.started.append(worker)
        return worker.start(timeout=60)

    def web(self, build: str, where: Path) -> WebProcess:
        web = WebProcess(self.env(build, where), self.logs / f"web{build}.log", cwd=where)
        self.started.append(web)
        web.start()
        return web

    def beat(self, build: str, where: Path) -> BeatProcess:
        beat = BeatProcess(self.env(build, where), self.logs / f"beat{build}.log", cwd=where)
        self.started.append(beat)
        beat.start()
        return beat

    def stop_all(self) -> None:
        for process in self.started:
            process.kill() if isinstance(process, WorkerProcess) else process.stop()


@pytest.fixture
def stack(clean_sandbox: SandboxProcess, tmp_path: Path) -> Iterator[Stack]:
    running = Stack(clean_sandbox, tmp_path / "logs")
    try:
        yield running
    finally:
        running.stop_all()


def waiting_for_approval(run_id: str) -> None:
    wait_for(
        lambda: getattr(durable.snapshot(run_id), "waiting_for", None) == "approval",
        timeout=120,  # an agent run's turns, on a machine the rest of the suite keeps busy
        what=f"{run_id} to wait for approval",
    )


def test_three_waivers_waiting_across_a_deploy__checked__none_parked__each_as_decided(
    stack: Stack, clean_sandbox: SandboxProcess, tmp_path: Path, settings: Any
) -> None:
    b_tree = tree(tmp_path, "b", fee_schedule_step)
    c_tree = tree(tmp_path, "c", renamed_booking_step)
    settings.AGENTFLOW_BUILD_ID = "A"  # this process reads as build A's web until the deploy
    web_a = stack.web("A", ROOT)
    beat_a = stack.beat("A", ROOT)
    worker_a = stack.worker("A", ROOT)
    references = ["DPLA01", "DPLA02", "DPLA03"]
    public = [
        web_a.submit_refund(ref, waiver_reason="bereavement", waiver_details=DETAILS)
        for ref in references
    ]
    run_ids = [str(RefundRequest.objects.get(public_id=p).workflow_id) for p in public]
    for run_id in run_ids:
        waiting_for_approval(run_id)
    assert set(WorkflowRun.objects.filter(pk__in=run_ids).values_list("build", flat=True)) == {"A"}

    # Before the deploy, with B's code: each run would move to B.
    code, report = deploy_check(b_tree, stack.env("B", b_tree))
    assert code == 0, report
    assert report["build"] == "B"
    decisions = {run["run_id"]: run for run in report["runs"]}
    assert set(decisions) == set(run_ids)
    for run in decisions.values():
        assert run["decision"] == "upgrade" and run["started_on"] == "A"
        assert run["position"]["step"] == "request_fee_waiver"
    assert report["summary"]["park"] == 0
    # With a build that renamed a step these runs passed, none is an upgrade.
    code, renamed = deploy_check(c_tree, stack.env("C", c_tree))
    assert code == 0, renamed
    assert {run["decision"] for run in renamed["runs"]} == {"pinned"}
    for run in renamed["runs"]:
        assert "fetch_booking" in run["reason"] and run["diff"].startswith("- ")

    # The deploy: A's web and beat stop, A's worker is left to drain; B's start.
    web_a.stop()
    beat_a.stop()
    worker_b = stack.worker("B", b_tree)
    stack.beat("B", b_tree)
    web_b = stack.web("B", b_tree)
    settings.AGENTFLOW_BUILD_ID = "B"  # operators decide on B's console

    durable.approve(run_ids[0], actor="ops", reason="We're sorry for your loss.")
    finished(run_ids[0], worker_b, timeout=90)
    worker_a.kill()  # SIGKILLed while draining
    durable.approve(run_ids[1], actor="ops", reason="We're sorry for your loss.")
    durable.reject(run_ids[2], actor="ops", reason="We need a death certificate")
    for run_id in run_ids[1:]:
        finished(run_id, worker_b, timeout=90)

    for index, run_id in enumerate(run_ids):
        run = WorkflowRun.objects.get(pk=run_id)
        assert run.status == RunStatus.COMPLETED, run.error
        assert not RunEvent.objects.filter(
            run_id=run_id,
            kind__in=[RunEvent.Kind.NEEDS_ATTENTION, RunEvent.Kind.VERSION_MISMATCH],
        ).exists()
        ledger = partner_effects(clean_sandbox, run_id)
        assert len(ledger["boarding_passes"]) == 1 and holds_left(ledger) == []
        assert money_kept(ledger) == (4500 if index == 2 else 0)
        assert len(ledger["payments"]) == (1 if index == 2 else 0)
    # Those decided after A's worker died ran on B's code, its new step included.
    for run_id in run_ids[1:]:
        run = WorkflowRun.objects.get(pk=run_id)
        assert (run.build, run.started_build, run.version) == ("B", "A", 5)
        assert StepCheckpoint.objects.get(run_id=run_id, name=NEW_STEP).build == "B"
        assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.UPGRADED).exists()
    status, body = web_b.get(f"/refunds/{public[2]}/status.json")
    assert status == 200 and json.loads(body)["status"] == "COMPLETED"
    assert django_settings.AGENTFLOW_BUILD_ID == "B"


def test_agent_refund_under_a_new_prompt__checked_at_its_first_divergence__finishes_on_its_build(
    stack: Stack,
    clean_sandbox: SandboxProcess,
    tmp_path: Path,
    settings: Any,
    admin_client: Client,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d_tree = tree(tmp_path, "d", prompt_changed, module="refunds/agent/prompts.py")
    settings.AGENTFLOW_BUILD_ID = "A"
    settings.REFUNDS_ENGINE = "agent"
    worker_a = stack.worker("A", ROOT, "agent")
    run_id = submit("DPLG01", waiver_reason="bereavement", waiver_details=DETAILS)
    waiting_for_approval(run_id)
    first_turn = StepCheckpoint.objects.filter(run_id=run_id, kind="llm").order_by("seq")[0]

    code, report = deploy_check(d_tree, stack.env("D", d_tree, "agent"))
    assert code == 0, report
    [run] = report["runs"]
    assert run["decision"] == "pinned" and run["started_on"] == "A"
    # Its first model turn is where the new prompt first shows: the first divergent position.
    assert run["reason"].startswith(
        f"diverged from its recorded history: Position {first_turn.seq}"
    )
    assert run["diff"].startswith("- ")
    assert report["summary"] == {
        "runs": 1,
        "upgrade": 0,
        "pinned": 1,
        "park": 0,
        "builds_to_keep": ["A"],
    }

    # The admin of build D offers the move, with the diff, and refuses it.
    monkeypatch.setattr(prompts, "SYSTEM_PROMPT", f"{PROMPT_LINE}\n{prompts.SYSTEM_PROMPT}")
    settings.AGENTFLOW_BUILD_ID = "D"
    response = admin_client.get(f"/admin/agentflow/workflowrun/{quote(run_id)}/change/")
    # Once seen empty after earlier tests in one serial process: say what it was if it recurs.
    assert response.status_code == 200, (response.status_code, response.get("Location"))
    page = response.content.decode()
    assert "Move to the current build" in page and "this build (D) cannot take it" in page
    moved = admin_client.post(
        f"/admin/agentflow/workflowrun/{quote(run_id)}/move/", {"reason": "deploy D"}, follow=True
    )
    said = [str(m) for m in moved.context["messages"]]
    assert any("was not moved to the current build" in m and "diverged" in m for m in said), said
    monkeypatch.undo()

    # D deployed beside A; the decision comes; the run finishes on A's code.
    stack.worker("D", d_tree, "agent")
    settings.AGENTFLOW_BUILD_ID = "D"
    durable.approve(run_id, actor="ops", reason="We're sorry for your loss.")
    done = finished(run_id, worker_a, timeout=120)

    assert done.status == RunStatus.COMPLETED, done.error
    assert set(StepCheckpoint.objects.filter(run_id=run_id).values_list("build", flat=True)) == {
        "A"
    }
    ledger = partner_effects(clean_sandbox, run_id)
    assert len(ledger["boarding_passes"]) == 1 and money_kept(ledger) == 0
