"""Agent runs (docs/agent.md) in this process against real Postgres: replay from the top, one
new step per task, memo by position and arguments, divergence, failure and compensation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus, StepKind, StepStatus
from agentflow._engine import runtime
from agentflow.models import RunEvent, StepCheckpoint, SupersededStep, WorkflowRun
from tests.support import partner, workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def calls(run_id: str) -> list[tuple[int, str, str, str]]:
    return list(
        StepCheckpoint.objects.filter(run_id=run_id)
        .order_by("seq")
        .values_list("seq", "name", "kind", "status")
    )


def test_agent__one_call_per_task_replayed_from_the_top__completes_with_its_answer(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.agent.name)

    run = drive(run_id)

    assert run.status == RunStatus.COMPLETED, run.error
    assert run.output == "Bought 2 apples at $3."
    assert calls(run_id) == [
        (1, "llm", StepKind.LLM, StepStatus.COMPLETED),
        (2, "lookup", StepKind.READ, StepStatus.COMPLETED),
        (3, "lookup", StepKind.READ, StepStatus.COMPLETED),
        (4, "llm", StepKind.LLM, StepStatus.COMPLETED),
        (5, "buy", StepKind.EFFECT, StepStatus.COMPLETED),
        (6, "llm", StepKind.LLM, StepStatus.COMPLETED),
    ]
    assert partner.effects() == {durable.idempotency_key(run_id, 5): 1}
    # Each body ran once although every task replayed the function from the top.
    assert partner.execution_counts(run_id) == {
        (run_id, 2, "lookup"): 1,
        (run_id, 3, "lookup"): 1,
        (run_id, 5, "buy"): 1,
    }


def test_agent__memo_by_position_and_arguments__the_same_tool_twice_gets_two_real_results(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """A memo keyed by tool name would hand apple's price to pear's call,
    and after a crash between the two calls would replay only the first."""
    run_id = durable.start(workflows.agent.name)
    runtime.run_step(run_id, 1)  # the model's turn asks for both lookups
    runtime.run_step(run_id, 2)  # apple's lookup... then the worker "crashes" (nothing more)

    run = drive(run_id)  # a new task replays position 2 and makes position 3 for real

    assert run.status == RunStatus.COMPLETED
    outputs = dict(
        StepCheckpoint.objects.filter(run_id=run_id, name="lookup").values_list("seq", "output")
    )
    assert outputs == {
        2: {"ok": True, "result": {"item": "apple", "price": 3}},
        3: {"ok": True, "result": {"item": "pear", "price": 5}},
    }
    lookups = [r for r in partner.executions(run_id) if r["step"] == "lookup"]
    assert [(r["seq"], r["attempt"]) for r in lookups] == [(2, 1), (3, 1)]


def test_agent__a_failure_in_code_after_an_effect__compensates_it_then_tells(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.agent.name, input={"fail_after_buy": True})

    run = drive(run_id)

    assert run.status == RunStatus.FAILED
    assert run.error == "the shop closed"
    assert [name for _, name, _, _ in calls(run_id)][-2:] == ["refund@5", "tell"]
    refund = StepCheckpoint.objects.get(run_id=run_id, name="refund@5")
    assert refund.output["result"]["refunded"] == "apple"
    assert partner.effects()[refund.idempotency_key] == 1
    event = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.COMPENSATION)
    assert event.data["undo"] == ["refund@5"]


def test_agent__another_call_at_a_recorded_position__parked_with_a_readable_diff(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.agent.name)
    for seq in (1, 2, 3):
        runtime.run_step(run_id, seq)
    # The record at position 2 says another call was made there than the function makes now.
    StepCheckpoint.objects.filter(run_id=run_id, seq=2).update(
        arguments={
            **StepCheckpoint.objects.get(run_id=run_id, seq=2).arguments,
            "arguments": {"item": "banana"},
            "digest": "the digest of a lookup of bananas",
        },
        digest="the digest of a lookup of bananas",
    )

    run = drive(run_id)

    assert run.status == RunStatus.NEEDS_ATTENTION
    assert run.error.startswith("diverged from its recorded history: Position 2 diverged")
    assert 'arguments.item: "banana" → "apple"' in run.error
    event = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.DIVERGENCE)
    assert event.data["position"] == 2 and event.seq == 4


def test_fork__from_a_diverged_position__same_calls_reused_others_keyed_by_branch(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.agent.name)
    for seq in (1, 2, 3):
        runtime.run_step(run_id, seq)
    recorded = StepCheckpoint.objects.get(run_id=run_id, seq=2)
    StepCheckpoint.objects.filter(pk=recorded.pk).update(
        arguments={
            **recorded.arguments,
            "arguments": {"item": "banana"},
            "digest": "the digest of a lookup of bananas",
        },
        digest="the digest of a lookup of bananas",
    )
    assert drive(run_id).status == RunStatus.NEEDS_ATTENTION

    preview = store.fork_preview(run_id, 2)
    store.run_fork(run_id, position=2, actor="ops", reason="the code moved on")
    run = drive(run_id)

    assert [cp.seq for cp in preview] == [2, 3]
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.branch == 1
    keys = dict(StepCheckpoint.objects.filter(run_id=run_id).values_list("seq", "idempotency_key"))
    assert keys[2] == f"{run_id}_b1_step_2"  # a new call: the branch is in its key
    assert keys[3] == f"{run_id}_step_3"  # pear's lookup, made before the fork: reused
    assert keys[5] == f"{run_id}_b1_step_5"
    lookups = [(r["seq"], r["step"]) for r in partner.executions(run_id) if r["step"] == "lookup"]
    assert lookups == [(2, "lookup"), (3, "lookup"), (2, "lookup")]  # pear's ran once
    superseded = SupersededStep.objects.filter(run_id=run_id).order_by("seq")
    assert [(s.branch, s.seq, s.name) for s in superseded] == [(0, 2, "lookup"), (0, 3, "lookup")]
    fork = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.FORK)
    assert (fork.actor, fork.data["position"], fork.data["branch"]) == ("ops", 2, 1)


def test_fork__refused_for_graph_runs_and_past_an_unknown_effect(
    drive: Callable[[str], WorkflowRun],
) -> None:
    graph = durable.start(workflows.declined.name)
    assert drive(graph).status == RunStatus.FAILED
    with pytest.raises(durable.ActionRefused, match="only agent"):
        store.run_fork(graph, position=1, actor="ops", reason="x")

    run_id = durable.start(workflows.agent.name)
    for seq in (1, 2, 3, 4):
        runtime.run_step(run_id, seq)
    now = timezone.now()  # the buy was in flight when its worker died; nobody can say more
    StepCheckpoint.objects.create(
        run_id=run_id,
        seq=5,
        name="buy",
        kind=StepKind.EFFECT,
        status=StepStatus.IN_PROGRESS,
        attempts=1,
        idempotency_key=durable.idempotency_key(run_id, 5),
        lease_expires_at=now,
        first_started_at=now,
        started_at=now,
    )
    assert store.run_park(run_id, 5, "outcome unknown: buy", fence=1)

    with pytest.raises(
        durable.ActionRefused, match=r"whether buy \(position 5\) took effect is unknown"
    ):
        store.run_fork(run_id, position=4, actor="ops", reason="x")


def test_fork__then_failing__undoes_the_superseded_effects_the_new_branch_did_not_adopt(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """Money is never kept because a fork set its charge aside: the superseded buy happened,
    so when the forked run fails, it is refunded like the branch's own effects."""
    run_id = durable.start(workflows.agent.name, input={"fail_if_forked": True})
    for seq in (1, 2, 3, 4, 5):  # ...the buy at 5 made, then turn 3 would come
        runtime.run_step(run_id, seq)
    turn_2 = StepCheckpoint.objects.get(run_id=run_id, seq=4)
    recorded = turn_2.arguments
    StepCheckpoint.objects.filter(pk=turn_2.pk).update(
        arguments={
            **recorded,
            "arguments": {**recorded["arguments"], "model": "another model"},
            "digest": "the digest of the turn as another model was asked",
        },
        digest="the digest of the turn as another model was asked",
    )
    assert drive(run_id).status == RunStatus.NEEDS_ATTENTION  # diverged at 4
    store.run_fork(run_id, position=4, actor="ops", reason="x")

    run = drive(run_id)

    assert run.status == RunStatus.FAILED, run.error
    names = [name for _, name, _, _ in calls(run_id)]
    assert names[-2:] == ["refund@b0.5", "tell"]
    undo = StepCheckpoint.objects.get(run_id=run_id, name="refund@b0.5")
    assert undo.output["result"]["refunded"] == "apple"
    bought = durable.idempotency_key(run_id, 5)
    assert partner.effects() == {
        bought: 1,
        undo.idempotency_key: 1,
        StepCheckpoint.objects.get(run_id=run_id, name="tell").idempotency_key: 1,
    }


def test_agent__tokens_spent_on_each_turn_and_saved_by_every_replay_are_counted(
    drive: Callable[[str], WorkflowRun], client: Any, settings: Any
) -> None:
    from tests.agentflow.integration.test_ops_views import scrape, value

    settings.AGENTFLOW_METRICS_PUBLIC = True  # DEBUG is off in tests: /metrics is closed

    labels = {"workflow": workflows.agent.name, "model": "scripted-shopper"}
    spent, saved = "agentflow_model_tokens_spent_total", "agentflow_model_tokens_saved_total"
    before = scrape(client)
    run_id = durable.start(workflows.agent.name)

    assert drive(run_id).status == RunStatus.COMPLETED
    after = scrape(client)

    turns = {
        cp.seq: cp.output["usage"]["total_tokens"]
        for cp in StepCheckpoint.objects.filter(run_id=run_id, name="llm")
    }
    assert value(after, spent, **labels) - value(before, spent, **labels) == sum(turns.values())
    # Every later task (positions 2..6 and the one that found the answer) replays each turn
    # before it: a turn at position p is handed back 6 - p + 1 times.
    expected = sum(tokens * (6 - seq + 1) for seq, tokens in turns.items())
    assert value(after, saved, **labels) - value(before, saved, **labels) == expected


# --- what a model cannot make happen (issue 15) ---------------------------------------------------
def test_agent__refused_calls_make_no_effect_and_are_never_compensated(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """Issue 19 8c: a call the engine refused (bad arguments, over its tool's max_calls) is
    recorded as refused and made nothing, so a failing run plans no compensation for it."""
    run_id = durable.start(workflows.agent.name, input={"ask": "greedy", "fail_after_buy": True})

    run = drive(run_id)

    assert run.status == RunStatus.FAILED
    turn_2 = [(seq, name, kind) for seq, name, kind, _ in calls(run_id)][4:7]
    assert turn_2 == [
        (5, "buy", StepKind.READ),  # qty "two": invalid, refused, nothing claimed
        (6, "buy", StepKind.EFFECT),
        (7, "buy", StepKind.READ),  # a second buy: over max_calls, refused
    ]
    refused = StepCheckpoint.objects.get(run_id=run_id, seq=7).output
    assert refused["ok"] is False and refused["result"]["error"] == "limit_reached"
    event = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.COMPENSATION)
    assert event.data["undo"] == ["refund@6"]
    bought = [r for r in partner.executions(run_id) if r["step"] == "buy"]
    assert [r["seq"] for r in bought] == [6]
    refund = StepCheckpoint.objects.get(run_id=run_id, name="refund@6")
    assert partner.effects() == {
        durable.idempotency_key(run_id, 6): 1,
        refund.idempotency_key: 1,
        StepCheckpoint.objects.get(run_id=run_id, name="tell").idempotency_key: 1,
    }


def test_agent__a_final_answer_that_is_not_done_fails_the_run_never_completes(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.agent.name, input={"ask": "nothing"})

    run = drive(run_id)

    assert run.status == RunStatus.FAILED
    assert run.error == "nothing was bought"
    assert [name for _, name, _, _ in calls(run_id)] == ["llm", "tell"]  # told, nothing undone


@pytest.mark.parametrize(
    ("max_tool_calls", "ran"),
    [("40", 10), ("3", 3)],  # the turn's cap (10), or the run's when lower
)
def test_agent__tool_calls_past_the_turn_s_or_run_s_cap_are_refused(
    drive: Callable[[str], WorkflowRun], settings: Any, max_tool_calls: str, ran: int
) -> None:
    settings.AGENTFLOW_AGENT_MAX_TOOL_CALLS = int(max_tool_calls)
    run_id = durable.start(workflows.agent.name, input={"ask": "flood"})

    run = drive(run_id, max_steps=80)

    lookups = StepCheckpoint.objects.filter(run_id=run_id, name="lookup").order_by("seq")
    assert lookups.count() == 12  # every call the turn asked for has its result
    assert [cp.output["ok"] for cp in lookups] == [True] * ran + [False] * (12 - ran)
    assert lookups.last().output["result"]["error"] == "limit_reached"  # type: ignore[union-attr]
    assert len([r for r in partner.executions(run_id) if r["step"] == "lookup"]) == ran
    if ran == 3:  # the run's calls are spent: its buy is refused too, so it is not done
        assert run.status == RunStatus.FAILED and run.error == "nothing was bought"
    else:
        assert run.status == RunStatus.COMPLETED, run.error


def test_agent__a_sent_message_edited_in_place__diverges_at_the_turn_that_sends_it_changed(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """A turn keeps the previous turn's messages by identity; a message changed in place since
    it was hashed is found, and the replay compares every turn by value instead."""
    run_id = durable.start(workflows.editing_agent.name)
    for seq in (1, 2, 3, 4):  # turn 1, its count, turn 2, its count
        runtime.run_step(run_id, seq)
    partner.release(f"{run_id}/edit")  # a deploy: the function now edits the user's message

    run = drive(run_id)

    assert run.status == RunStatus.NEEDS_ATTENTION
    event = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.DIVERGENCE)
    assert event.data["position"] == 3  # turn 2, the first sent after the edit
    [change] = event.data["changes"]
    assert change["path"] == "arguments.messages[1].content"
    assert change["now"] == '"Square 1 to 19, twice."'
