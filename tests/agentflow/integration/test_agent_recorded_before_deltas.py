"""A run recorded before per-turn deltas (each model turn's checkpoint holding the whole
conversation) goes on replaying: its rows, dumped from a 20-turn run made by the engine of
main at 966ee4d, are loaded as they were and driven by this engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core import serializers

from agentflow._base.states import RunStatus, StepStatus
from agentflow.agent.turns import whole_request
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow.testing import run_to_end
from tests.support import partner, workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

#: Made with the engine of main by running `long_agent` in this process until its twentieth
#: turn (the final answer, at position 39) was recorded, then dumping the run, its checkpoints
#: and events with Django's JSON serializer.
RECORDED = Path(__file__).parent / "fixtures" / "long_agent_run_recorded_on_main.json"


def load_recorded_run() -> str:
    run_id = ""
    for found in serializers.deserialize("json", RECORDED.read_text()):
        if isinstance(found.object, WorkflowRun):
            run_id = found.object.pk
        else:
            found.object.pk = None  # this database's own ids
        found.save()
    return run_id


def test_recorded_whole__replays_every_turn_without_a_model_request_or_a_tool_call() -> None:
    run_id = load_recorded_run()
    turns = StepCheckpoint.objects.filter(run_id=run_id, name="llm")
    assert turns.count() == 20 and all("keep" not in t.arguments["arguments"] for t in turns)
    asked = len(workflows.counting_requests)

    run = run_to_end(run_id)

    assert (run.status, run.output) == (RunStatus.COMPLETED, "Counted to 19."), run.error
    assert len(workflows.counting_requests) == asked  # no model request
    assert partner.executions(run_id) == []  # no tool call
    assert StepCheckpoint.objects.filter(run_id=run_id).count() == 39


def test_recorded_whole__a_new_turn_after_them_is_stored_as_a_delta() -> None:
    run_id = load_recorded_run()
    StepCheckpoint.objects.filter(run_id=run_id, seq=39).delete()  # the final answer not yet
    WorkflowRun.objects.filter(pk=run_id).update(current_seq=39)

    run = run_to_end(run_id)

    assert (run.status, run.output) == (RunStatus.COMPLETED, "Counted to 19."), run.error
    final = StepCheckpoint.objects.get(run_id=run_id, seq=39)
    assert final.status == StepStatus.COMPLETED
    added = final.arguments["arguments"]
    # It keeps turn 19's 38 messages and adds the answer and result of its call; its tools are
    # those of the turn before it, recorded whole.
    assert (added["keep"], len(added["messages"]), "tools" in added) == (38, 2, False)
    whole = None
    for turn in StepCheckpoint.objects.filter(run_id=run_id, name="llm").order_by("seq"):
        whole = whole_request(turn.arguments["arguments"], whole)
    assert whole is not None and len(whole["messages"]) == 40
    assert whole["tools"] == workflows.counting.openai_tools()
    assert partner.executions(run_id) == []
