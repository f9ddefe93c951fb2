"""agentflow's commands under bad input, against real Postgres: each refusal is one line and a
non-zero exit (1: the command refused what it was asked; 2: the parser refused how it was
asked), nothing is written, and no traceback. `agentflow_signal`'s arguments are fuzzed;
two real subprocesses show what a shell sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from hypothesis import given
from hypothesis import strategies as st

from agentflow import durable
from agentflow._core.serialization import MAX_DEPTH
from agentflow.models import RunSignal, WorkflowRun
from agentflow.testing import run_to_end
from agentflow.testing.processes import current_database_url
from tests.support import workflows
from tests.support.malformed import BUDGET, logged, refusal

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


@pytest.fixture
def run_id() -> str:
    """A run waiting for the signal "reply"."""
    run_id = durable.start(workflows.signalled.name)
    assert run_to_end(run_id, retries=False).waiting_for == "signal"
    return run_id


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def shell(*args: str) -> subprocess.CompletedProcess[str]:
    """`manage.py ARGS` against this test's database, as an operator runs it (a metrics token
    set, so that the deployment warning about /metrics does not join the output)."""
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=settings.BASE_DIR,
        env={**os.environ, "DATABASE_URL": current_database_url(), "AGENTFLOW_METRICS_TOKEN": "t"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- agentflow_signal: what the probe sent ------------------------------------------------------
@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ('"a\\u0000b"', "the payload of signal 'reply' holds a NUL character"),
        ('{"k\\u0000": 1}', "the payload of signal 'reply' holds a NUL character"),
        ('"\\ud800"', "the payload of signal 'reply' holds a NUL character"),
        (nested(MAX_DEPTH + 1), f"the payload of signal 'reply' is nested deeper than {MAX_DEPTH}"),
        (nested(50_000), "--payload is nested too deep to be read"),
        ("1" * 5000, "--payload is not JSON: Exceeds the limit"),
        ("NaN", "the payload of signal 'reply' is not JSON: Out of range float values"),
    ],
    ids=["nul", "nul-key", "lone-surrogate", "too-deep", "very-deep", "5000-digits", "nan"],
)
def test_agentflow_signal__a_payload_postgres_cannot_store__one_line(
    run_id: str, payload: str, says: str
) -> None:
    said = refusal("agentflow_signal", run_id, "reply", f"--payload={payload}", "--signal-id=a")

    assert said.startswith(says), said
    assert not RunSignal.objects.exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["wf_\x00", "reply"], "a run id is text without NUL"),
        (["{run}", "re\x00ply"], "a signal needs a name (1-200 characters, without NUL)"),
        (["{run}", "reply", "--signal-id=\x00"], "a signal needs a signal_id"),
        (["{run}", "r" * 201], "a signal needs a name (1-200 characters, without NUL)"),
        (["{run}"], "Error: the following arguments are required: name"),
        (["{run}", "reply", "--bogus"], "Error: unrecognized arguments: --bogus"),
    ],
    ids=["nul-run-id", "nul-name", "nul-signal-id", "long-name", "no-name", "unknown-option"],
)
def test_agentflow_signal__other_bad_arguments__one_line(
    run_id: str, args: list[str], says: str
) -> None:
    said = refusal("agentflow_signal", *[a.replace("{run}", run_id) for a in args])

    assert said.startswith(says), said
    assert not RunSignal.objects.exists()


def test_agentflow_signal__from_a_shell__one_line_and_exit_1_or_2(run_id: str) -> None:
    deep = shell("agentflow_signal", run_id, "reply", f"--payload={nested(50_000)}")
    nul = shell("agentflow_signal", run_id, "reply", '--payload={"text": "\\u0000"}')
    unparsed = shell("agentflow_signal", run_id)

    assert (deep.returncode, deep.stdout) == (1, "")
    assert deep.stderr == "CommandError: --payload is nested too deep to be read\n"
    assert (nul.returncode, nul.stdout) == (1, "")
    assert nul.stderr.startswith("CommandError: the payload of signal 'reply' holds a NUL")
    assert nul.stderr.count("\n") == 1
    assert (unparsed.returncode, unparsed.stdout) == (2, "")
    assert unparsed.stderr == (
        "CommandError: Error: the following arguments are required: name "
        "(--help lists the arguments)\n"
    )
    assert not RunSignal.objects.exists()


# --- agentflow_signal: the fuzz -----------------------------------------------------------------
_text = st.text(max_size=60)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
_payloads = st.one_of(
    st.none(),
    _text,
    _json.map(lambda value: json.dumps(value, allow_nan=True)),
    st.integers(MAX_DEPTH - 2, 5000).map(nested),
)


def test_fuzz__agentflow_signal_arguments__delivered_or_refused_in_one_line(run_id: str) -> None:
    delivered: list[str] = []

    @BUDGET
    @given(
        # Not "-x": argparse takes those for options (and "-h" for a request for help).
        run=st.one_of(st.just(run_id), _text.filter(lambda text: not text.startswith("-"))),
        name=st.one_of(st.just("reply"), _text.filter(lambda text: not text.startswith("-"))),
        payload=_payloads,
        signal_id=st.one_of(st.none(), _text),
    )
    def fuzzed(run: str, name: str, payload: str | None, signal_id: str | None) -> None:
        args = [run, name]
        args += [f"--payload={payload}"] if payload is not None else []
        args += [f"--signal-id={signal_id}"] if signal_id is not None else []
        out = StringIO()
        with logged() as lines:
            try:
                call_command("agentflow_signal", *args, stdout=out, stderr=StringIO())
            except CommandError as refused:
                assert "\n" not in str(refused), str(refused)
            else:
                said = out.getvalue()
                assert said.startswith(("delivered signal", "duplicate: signal id")), said
                if said.startswith("delivered"):
                    delivered.append(said)
        assert lines.tracebacks_or_errors() == []

    fuzzed()

    assert RunSignal.objects.filter(run_id=run_id).count() == len(delivered)
    assert RunSignal.objects.count() == len(delivered)


# --- the other commands -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("command", "args", "says"),
    [
        (
            "start_workflow",
            ["crash_chain", '--input={"a": "\\u0000"}'],
            "workflow input holds a NUL",
        ),
        ("start_workflow", ["crash_chain", f"--input={nested(50_000)}"], "--input is nested too"),
        ("start_workflow", ["crash_chain", f"--input={nested(200)}"], "workflow input is nested"),
        ("start_workflow", ["crash_chain", "--business-key=k\x00"], "a business key is text"),
        ("start_workflow", ["crash_chain", f"--business-key={'k' * 201}"], "a business key is"),
        ("start_workflow", ["no\x00such"], "no workflow named 'no\\x00such'"),
        ("sweep", ["--limit=0"], "Error: argument --limit: '0' is not a whole number of 1"),
        ("sweep", ["--limit=-3"], "Error: argument --limit: '-3' is not a whole number of 1"),
        ("sweep", [f"--limit={'9' * 5000}"], "Error: argument --limit: '999"),
        ("sweep", ["--limit=\u0663"], "Error: argument --limit: '\u0663' is not a whole number"),
        ("purge", [f"--older-than={'9' * 5000}d"], "Error: argument --older-than: '999"),
        (
            "purge",
            ["--older-than=\u0663d"],
            "Error: argument --older-than: '\u0663d' is not an age",
        ),
        ("agentflow_builds", ["extra"], "Error: unrecognized arguments: extra"),
        ("agentflow_deploy_check", ["--bogus"], "Error: unrecognized arguments: --bogus"),
        ("bench", ["--partner-rate=nan"], "Error: argument --partner-rate: 'nan' is not a number"),
        ("bench", ["--runs=1e3"], "Error: argument --runs: '1e3' is not a whole number of 1"),
        ("bench_admin", ["--history=0"], "Error: argument --history: '0' is not a whole number"),
        ("bench_admin", ["--events=-1"], "Error: argument --events: '-1' is not a whole number"),
    ],
)
def test_commands__bad_arguments__one_line_and_nothing_written(
    command: str, args: list[str], says: str
) -> None:
    said = refusal(command, *args)

    assert said.startswith(says), said
    assert not WorkflowRun.objects.exists()


def test_commands__from_a_shell__the_parsers_refusal_is_one_line_and_exit_2() -> None:
    done = shell("sweep", "--limit=many")

    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        "CommandError: Error: argument --limit: 'many' is not a whole number of 1 or more "
        "(--help lists the arguments)\n"
    )
