"""What an agent run's replay reads (docs/agent.md): each call's digest and output, never its
arguments, which hold a model turn's messages; the arguments are read only when a digest
differs, for the diff, or for a call recorded before the digest had a column of its own."""

from __future__ import annotations

import pytest

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus, StepKind, StepStatus
from agentflow._engine import runtime
from agentflow.models import RunEvent, StepCheckpoint
from agentflow.testing import run_to_end
from tests.support import partner, workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def recorded_turns(run_id: str, turns: int) -> None:
    """The counting agent's first `turns` model turns and their counts, each in its own task."""
    for seq in range(1, 2 * turns + 1):
        runtime.run_step(run_id, seq)


def test_digest__each_call_records_its_fingerprint_s_digest_in_its_own_column() -> None:
    run_id = durable.start(workflows.long_agent.name)
    recorded_turns(run_id, 3)

    rows = StepCheckpoint.objects.filter(run_id=run_id).order_by("seq")

    assert [row.kind for row in rows] == [StepKind.LLM, StepKind.READ] * 3
    assert all(row.digest and row.digest == row.arguments["digest"] for row in rows)
    read = store.replay_load(run_id, 7)
    assert read == {
        row.seq: (row.name, StepStatus.COMPLETED, row.digest, row.output) for row in rows
    }


def test_replay__reads_no_arguments__turns_whose_stored_messages_are_lost_still_replay() -> None:
    """The messages each turn stored are blanked: a replay that read them would fail or differ;
    one that compares digests hands every turn back without asking the model again."""
    run_id = durable.start(workflows.long_agent.name)
    recorded_turns(run_id, 5)
    StepCheckpoint.objects.filter(run_id=run_id, kind=StepKind.LLM).update(arguments={"lost": True})
    asked = len(workflows.counting_requests)

    runtime.run_step(run_id, 11)  # turn 6: five turns and five counts replayed

    assert workflows.counting_requests[asked:] == [6]  # only the new turn was asked
    assert StepCheckpoint.objects.get(run_id=run_id, seq=11).status == StepStatus.COMPLETED


def test_replay__calls_recorded_before_the_digest_column__still_replay_from_their_arguments() -> (
    None
):
    """Rows written before the column (its default, empty): each call is checked against its
    stored fingerprint, model turns as deltas or whole, then the run goes on as usual."""
    run_id = durable.start(workflows.long_agent.name)
    recorded_turns(run_id, 6)
    StepCheckpoint.objects.filter(run_id=run_id).update(digest="")
    asked = len(workflows.counting_requests)

    run = run_to_end(run_id)

    assert (run.status, run.output) == (RunStatus.COMPLETED, "Counted to 19."), run.error
    assert workflows.counting_requests[asked:] == list(range(7, 21))  # none asked again
    counted = [r["seq"] for r in partner.executions(run_id) if r["step"] == "count"]
    assert counted == list(range(2, 40, 2))  # each count made once
    new = StepCheckpoint.objects.filter(run_id=run_id, seq__gt=12)
    assert all(row.digest == row.arguments["digest"] for row in new)


def test_replay__a_turn_whose_digest_differs__parked_with_the_whole_messages_in_the_diff() -> None:
    """The digest says another request was sent at position 3; the diff reads the stored deltas
    and the request made now, message by message."""
    run_id = durable.start(workflows.long_agent.name)
    recorded_turns(run_id, 3)
    turn = StepCheckpoint.objects.get(run_id=run_id, seq=3)
    messages = turn.arguments["arguments"]["messages"]
    edited = [*messages[:-1], {**messages[-1], "content": '{"n":1,"square":2}'}]
    StepCheckpoint.objects.filter(pk=turn.pk).update(
        arguments={
            **turn.arguments,
            "arguments": {**turn.arguments["arguments"], "messages": edited},
        },
        digest="the digest of the request with another result",
    )

    run = run_to_end(run_id)

    assert run.status == RunStatus.NEEDS_ATTENTION
    event = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.DIVERGENCE)
    assert event.data["position"] == 3
    [change] = event.data["changes"]
    assert (change["path"], change["recorded"], change["now"]) == (
        "arguments.messages[3].content.square",
        "2",
        "1",
    )
