"""MCP tools under real crashes: real worker processes, the official SDK's stdio client and a
real MCP server subprocess (`tests/support/mcp_server.py`) whose ledger counts every effect
call it received, with the idempotency key its `_meta` carried.

A SIGKILL right after the effect, before its checkpoint: the takeover (an effect claimed and
not recorded; the tool has no reconcile, so nothing can ask first) calls again under the same
key, and the server, keying its effects by it, applies it once. After the checkpoint: never
called again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentflow import durable
from agentflow._base.states import StepKind
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.testing.waiting import wait_for
from tests.support import mcp_server, mcp_workflows
from tests.support.engine import stopped
from tests.support.processes import Workers, log_has

pytestmark = pytest.mark.django_db(transaction=True)

#: crash point -> how many calls of the effect the server receives (all under one key).
CRASHES = {
    None: 1,
    "add_note:after_effect": 2,  # made, not recorded: called again under its key, deduped
    "add_note:after_complete": 1,  # recorded: the replay hands the result back
}


@pytest.mark.parametrize("point", list(CRASHES), ids=str)
def test_mcp_effect__sigkill__applied_once_under_the_steps_key(
    point: str | None, workers: Workers, tmp_path: Path
) -> None:
    ledger = tmp_path / "mcp-ledger.jsonl"
    faults = {"AGENTFLOW_FAULTS": "1", "AGENTFLOW_CRASH_AT": point} if point else {}
    worker = workers.start(
        AGENTFLOW_WORKFLOW_MODULES="tests.support.workflows,tests.support.mcp_workflows",
        TEST_MCP_LEDGER=str(ledger),
        **faults,
    )
    run_id = durable.start(mcp_workflows.agent.name)

    run = stopped(run_id, timeout=90, worker=worker)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    if point:
        assert log_has(worker, f"fault injection: SIGKILL at {point}")
    steps = StepCheckpoint.objects.filter(run_id=run_id).order_by("seq")
    assert [s.name for s in steps] == [
        "llm",
        "lookup_order",
        "drop_orders",
        "llm",
        "add_note",
        "llm",
    ]
    note = steps.get(name="add_note")
    assert note.kind == StepKind.EFFECT  # the host's word, not the server's readOnlyHint
    calls = mcp_server.calls(ledger)
    assert len(calls) == CRASHES[point]
    assert {c["key"] for c in calls} == {note.idempotency_key}  # the server saw the step's key
    assert [c["applied"] for c in calls] == [True] + [False] * (len(calls) - 1)
    assert note.output == {
        "ok": True,
        "result": {"order": "A1", "note": "kettle shipped", "key": note.idempotency_key},
    }
    lookup = steps.get(name="lookup_order")
    assert lookup.kind == StepKind.READ
    assert lookup.output["result"] == mcp_server.ORDERS["A1"]
    dropped = steps.get(name="drop_orders")  # listed by the server, declared by nobody
    assert dropped.output["ok"] is False
    assert dropped.output["result"]["error"] == "unknown_tool"


def test_mcp_server_that_cannot_be_listed__the_run_waits_for_it__resumes_once_it_can(
    workers: Workers, tmp_path: Path
) -> None:
    """Not started yet (it dies before it is listed): a partner outage on `mcp:orders`, the
    run WAITING with the reason and no worker held; once it starts, the run goes on."""
    ledger, gate = tmp_path / "mcp-ledger.jsonl", tmp_path / "server-ready"
    worker = workers.start(
        AGENTFLOW_WORKFLOW_MODULES="tests.support.workflows,tests.support.mcp_workflows",
        TEST_MCP_LEDGER=str(ledger),
        TEST_MCP_GATE=str(gate),
    )
    run_id = durable.start(mcp_workflows.agent.name)

    held = wait_for(
        lambda: WorkflowRun.objects.filter(
            pk=run_id, status=durable.RunStatus.WAITING, hold="partner:mcp:orders"
        ).first(),
        timeout=60,
    )
    assert not StepCheckpoint.objects.filter(run_id=run_id).exists()  # nothing was asked
    assert RunEvent.objects.filter(
        run_id=run_id, kind=RunEvent.Kind.HELD, detail__startswith="waiting for mcp:orders: "
    ).exists(), held
    gate.touch()  # the server starts now

    run = stopped(run_id, timeout=90, worker=worker)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    assert len(mcp_server.calls(ledger)) == 1


@pytest.mark.parametrize("declared", ["reconcile", "none"])
def test_mcp_effect_answer_lost__its_lookup_adopts_it__or_the_run_parks_outcome_unknown(
    declared: str, workers: Workers, tmp_path: Path
) -> None:
    """SIGKILL after `add_note` was sent, before its checkpoint. Declared with a reconcile
    lookup (`find_note`, asked with the step's key), the takeover finds the note and adopts
    it; declared with neither a lookup nor idempotency by key, it parks for a person. Either
    way the effect is never sent twice."""
    ledger = tmp_path / "mcp-ledger.jsonl"
    worker = workers.start(
        AGENTFLOW_WORKFLOW_MODULES="tests.support.workflows,tests.support.mcp_workflows",
        TEST_MCP_LEDGER=str(ledger),
        TEST_MCP_NOTE=declared,
        AGENTFLOW_FAULTS="1",
        AGENTFLOW_CRASH_AT="add_note:after_effect",
    )
    run_id = durable.start(mcp_workflows.agent.name)

    run = stopped(run_id, timeout=90, worker=worker)

    assert log_has(worker, "fault injection: SIGKILL at add_note:after_effect")
    note = StepCheckpoint.objects.get(run_id=run_id, name="add_note")
    assert [c["key"] for c in mcp_server.calls(ledger)] == [note.idempotency_key]  # sent once
    if declared == "reconcile":
        assert run.status == durable.RunStatus.COMPLETED, run.error
        assert note.output["result"]["key"] == note.idempotency_key
        assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.RECONCILED).exists()
    else:
        assert run.status == durable.RunStatus.NEEDS_ATTENTION, run.error
        assert run.error.startswith("outcome unknown: add_note"), run.error
        assert note.status == "IN_PROGRESS"  # never FAILED: it may have happened


def test_mcp_effect_answer_lost__its_lookup_cannot_answer__parks_never_calls_it_blind(
    workers: Workers, tmp_path: Path
) -> None:
    """SIGKILL after `add_note` was sent; on the takeover its lookup answers with an error. The
    server keys nothing, so the engine's "inside the window the key protects a repeat" does not
    hold for it: the step parks "outcome unknown" with the lookup's error, and the effect is
    sent once."""
    ledger = tmp_path / "mcp-ledger.jsonl"
    worker = workers.start(
        AGENTFLOW_WORKFLOW_MODULES="tests.support.workflows,tests.support.mcp_workflows",
        TEST_MCP_LEDGER=str(ledger),
        TEST_MCP_NOTE="reconcile",
        TEST_MCP_FAULT="lookup_fails",
        AGENTFLOW_FAULTS="1",
        AGENTFLOW_CRASH_AT="add_note:after_effect",
    )
    run_id = durable.start(mcp_workflows.agent.name)

    run = stopped(run_id, timeout=90, worker=worker)

    assert log_has(worker, "fault injection: SIGKILL at add_note:after_effect")
    note = StepCheckpoint.objects.get(run_id=run_id, name="add_note")
    assert [c["key"] for c in mcp_server.calls(ledger)] == [note.idempotency_key]  # sent once
    assert run.status == durable.RunStatus.NEEDS_ATTENTION, run.error
    assert run.error.startswith("outcome unknown: add_note"), run.error
    assert "notes index is being rebuilt" in run.error, run.error
    assert note.status == "IN_PROGRESS"


#: (declared, fault) -> the server's calls of the effect ("applied" of each).
LOST = {
    ("none", "exit"): [True],  # parks: nothing can ask, a repeat could add a second note
    ("none", "hang"): [True],
    ("reconcile", "exit"): [True],  # the lookup finds the note: adopted, not sent again
    ("idempotent", "exit"): [True, False],  # called again under its key: the server dedupes
}


@pytest.mark.parametrize(("declared", "fault"), list(LOST), ids="-".join)
def test_mcp_effect_answer_lost_mid_call__retried_by_a_takeovers_rule(
    declared: str, fault: str, workers: Workers, tmp_path: Path
) -> None:
    """`add_note` is applied and then its answer is lost, the worker alive: the server goes
    away mid-call (`exit`) or never answers within the host's timeout (`hang`). It may have
    happened, so the retry goes as a takeover's does: the reconcile asks, idempotency by key
    allows calling again, and with neither the run parks "outcome unknown" with the reason,
    never calling the server again."""
    ledger = tmp_path / "mcp-ledger.jsonl"
    worker = workers.start(
        AGENTFLOW_WORKFLOW_MODULES="tests.support.workflows,tests.support.mcp_workflows",
        TEST_MCP_LEDGER=str(ledger),
        TEST_MCP_NOTE=declared,
        TEST_MCP_FAULT=fault,
        TEST_MCP_TIMEOUT="5",
    )
    run_id = durable.start(mcp_workflows.agent.name)

    run = stopped(run_id, timeout=120, worker=worker)

    note = StepCheckpoint.objects.get(run_id=run_id, name="add_note")
    calls = mcp_server.calls(ledger)
    assert [c["applied"] for c in calls] == LOST[declared, fault]
    assert {c["key"] for c in calls} == {note.idempotency_key}
    lost = "Timeout" if fault == "hang" else "it may have happened"
    if declared == "none":
        assert run.status == durable.RunStatus.NEEDS_ATTENTION, run.error
        assert run.error.startswith("outcome unknown: add_note may or may not"), run.error
        assert lost in run.error and "is not called again" in run.error, run.error
        assert note.status == "IN_PROGRESS"  # never FAILED: it may have happened
        return
    assert run.status == durable.RunStatus.COMPLETED, run.error
    assert note.output["result"]["key"] == note.idempotency_key
    failed = list(
        RunEvent.objects.filter(
            run_id=run_id, kind=RunEvent.Kind.ATTEMPT_FAILED, seq=note.seq
        ).values_list("detail", flat=True)
    )
    if declared == "idempotent":  # retried under its key
        assert len(failed) == 1 and lost in failed[0], failed
    else:  # asked at once, found, adopted
        assert failed == [], failed
    reconciled = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.RECONCILED).exists()
    assert reconciled == (declared == "reconcile")
