"""Signals from a shell (`manage.py agentflow_signal`), in this process against real Postgres:
each delivers once per id, and bad input is refused with the reason, delivering nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command

from agentflow import durable
from agentflow.models import RunSignal
from agentflow.states import RunStatus
from agentflow.testing import run_to_end
from agentflow.testing.processes import current_database_url
from tests.support import workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def waiting_run() -> str:
    run_id = durable.start(workflows.signalled.name)
    found = run_to_end(run_id, retries=False)
    assert found.waiting_for == "signal"
    return run_id


def signals_of(run_id: str) -> list[tuple[str, Any]]:
    return [(s.signal_id, s.payload) for s in RunSignal.objects.filter(run_id=run_id)]


# --- from a shell -------------------------------------------------------------------------------
def signal_command(*args: str) -> str:
    out = StringIO()
    call_command("agentflow_signal", *args, stdout=out)
    return out.getvalue()


def test_agentflow_signal__delivers__the_same_signal_id_again_does_nothing() -> None:
    run_id = waiting_run()

    said = signal_command(run_id, "reply", "--payload", '{"text": "yes"}', "--signal-id", "op-1")
    again = signal_command(run_id, "reply", "--payload", '{"text": "no"}', "--signal-id", "op-1")
    done = run_to_end(run_id)

    assert said.strip() == f"delivered signal 'reply' to {run_id} (signal id op-1)"
    assert (
        again.strip()
        == f"duplicate: signal id op-1 was sent to {run_id} before; nothing done again"
    )
    assert done.status == RunStatus.COMPLETED, done.error
    assert done.steps[1].output == {"payload": {"text": "yes"}}
    assert signals_of(run_id) == [("op-1", {"text": "yes"})]


def test_agentflow_signal__without_a_signal_id__a_new_one_each_time_printed() -> None:
    run_id = durable.start(workflows.two_replies.name)
    said = [signal_command(run_id, "reply"), signal_command(run_id, "reply")]

    ids = [s.signal_id for s in RunSignal.objects.filter(run_id=run_id)]
    assert len(set(ids)) == 2 and all(i.startswith("shell-") for i in ids)
    assert [f"(signal id {i})" in line for i, line in zip(ids, said, strict=True)] == [True] * 2


def test_agentflow_signal__refused__the_reason_as_a_command_error() -> None:
    run_id = waiting_run()
    signal_command(run_id, "reply", "--signal-id", "a")
    run_to_end(run_id)

    with pytest.raises(CommandError, match=r"signal 'reply' refused: the run is finished"):
        signal_command(run_id, "reply", "--signal-id", "b")
    with pytest.raises(CommandError, match="a signal needs a name"):
        signal_command(run_id, "", "--signal-id", "c")
    with pytest.raises(CommandError, match="--payload is not JSON"):
        signal_command(run_id, "reply", "--payload", "{nope")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["reply", "--payload", "{nope"], "--payload is not JSON"),
        (["reply", "--signal-id", "x" * 201], "a signal needs a signal_id (1-200 characters)"),
    ],
    ids=["bad-json", "long-id"],
)
def test_agentflow_signal__from_a_shell__bad_input_says_so_without_a_traceback(
    args: list[str], says: str
) -> None:
    run_id = waiting_run()
    done = subprocess.run(
        [sys.executable, "manage.py", "agentflow_signal", run_id, *args],
        cwd=django_settings.BASE_DIR,
        env={**os.environ, "DATABASE_URL": current_database_url()},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert says in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert signals_of(run_id) == []
