"""Runs that start runs and many runs at once (issue 40), in this process against real Postgres:
`start_many` is a few statements per thousand runs and idempotent on business keys; a parent's
children are started once whatever crashes, its wait counts them (a lost doorbell is repaired
by the recheck), a child's failure reaches it as a value, and its compensation cancels the
children still running; an agent parent says which fate its children meet (`compensate=`)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agentflow import _store as store
from agentflow import durable
from agentflow._base.context import StepContext
from agentflow._base.states import RunStatus
from agentflow._engine import runtime
from agentflow.exceptions import DefinitionError, InvalidInputError
from agentflow.models import RunEvent, WorkflowRun
from agentflow.testing import capture_messages, crash_at, run_to_end
from tests.support import partner, workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def children_of(run_id: str) -> list[WorkflowRun]:
    return list(WorkflowRun.objects.filter(parent_id=run_id).order_by("business_key"))


def run_children(parent_id: str) -> None:
    """Each child to its end, then its doorbells to the parent, as a worker takes them."""
    with capture_messages() as outbox:
        for child in children_of(parent_id):
            run_to_end(child.id)
    rings = outbox.for_run(parent_id)
    with capture_messages():
        for ring in rings:
            runtime.run_step(ring.run_id, ring.seq)


# --- many runs at once --------------------------------------------------------------------------
def test_start_many__a_thousand_runs_in_a_handful_of_statements__published_after_commit() -> None:
    runs = [(workflows.chain.name, {"i": i}, f"bulk-{i}") for i in range(1000)]
    with (
        capture_messages() as outbox,
        CaptureQueriesContext(connection) as queries,
        transaction.atomic(),
    ):
        ids = durable.start_many(runs)
        assert len(outbox) == 0  # nothing is published before the commit

    assert len(ids) == len(set(ids)) == 1000
    writes = [
        q for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]
    assert len(writes) <= 6, [q["sql"][:80] for q in writes]
    assert [m.run_id for m in outbox.messages] == ids
    assert {m.seq for m in outbox.messages} == {1}
    assert list(
        WorkflowRun.objects.filter(pk__in=ids)
        .values_list("status", flat=True)
        .order_by()
        .distinct()
    ) == [RunStatus.PENDING]


def test_start_many__idempotent_on_business_keys__returns_the_same_ids_and_publishes_none() -> None:
    first = durable.start_many(
        [(workflows.chain.name, {}, "k-1"), (workflows.chain.name, {}, "k-2")]
    )
    with capture_messages() as outbox:
        again = durable.start_many(
            [
                (workflows.chain.name, {}, "k-2"),
                (workflows.chain.name, {}, "k-3"),
                (workflows.chain.name, {}, "k-1"),
            ]
        )
    assert again[0] == first[1] and again[2] == first[0]
    assert [m.run_id for m in outbox.messages] == [again[1]]
    assert durable.start(workflows.chain.name, business_key="k-3") == again[1]


def test_start_many__bad_input__refused_and_nothing_started() -> None:
    with pytest.raises(InvalidInputError):
        durable.start_many([(workflows.chain.name, {}, "ok"), (workflows.chain.name, {}, "")])
    with pytest.raises(InvalidInputError):
        durable.start_many([(workflows.chain.name, {})])  # type: ignore[list-item]
    with pytest.raises(durable.UnknownWorkflowError):
        durable.start_many([("no such workflow", {}, None)])
    assert not WorkflowRun.objects.exists()


def test_start_many__rolled_back_with_the_callers_transaction() -> None:
    with capture_messages() as outbox, pytest.raises(RuntimeError), transaction.atomic():
        durable.start_many([(workflows.chain.name, {}, None)] * 3)
        raise RuntimeError("the caller's own write failed")
    assert not WorkflowRun.objects.exists()
    assert len(outbox) == 0


# --- runs that start runs -----------------------------------------------------------------------
def test_parent__starts_its_children_once__waits__completes_with_their_counts() -> None:
    parent_id = durable.start(workflows.family.name, input={"n": 5, "fail": [3]})

    waiting = run_to_end(parent_id, retries=False)

    assert waiting.status == RunStatus.WAITING and waiting.waiting_for == "signal"
    assert waiting.children == {RunStatus.PENDING: 5}
    kids = children_of(parent_id)
    assert [k.business_key for k in kids] == [f"{parent_id}:1:{i}" for i in range(5)]
    assert {k.parent_seq for k in kids} == {1}
    with capture_messages() as outbox:
        for kid in kids:
            run_to_end(kid.id)
    # Each child that ended rang its parent; the last one's ring ends its wait.
    rings = outbox.for_run(parent_id)
    assert len(rings) == 5
    with capture_messages():
        for ring in rings:
            runtime.run_step(ring.run_id, ring.seq)

    done = run_to_end(parent_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert done.children == {RunStatus.COMPLETED: 4, RunStatus.FAILED: 1}
    report = next(s for s in done.steps if s.name == "wait_kids").output["payload"]
    assert report["counts"] == {RunStatus.COMPLETED: 4, RunStatus.FAILED: 1}
    [failed] = [c for c in report["children"] if c["status"] == RunStatus.FAILED]
    assert "child 3 was told to fail" in failed["error"]
    assert durable.snapshot(kids[0].id).parent == parent_id  # type: ignore[union-attr]
    # The start step ran once: five children, never ten.
    assert WorkflowRun.objects.filter(parent_id=parent_id).count() == 5


def test_agent_parent__starts_its_children_once__waits__returns_their_counts() -> None:
    parent_id = durable.start(workflows.family_agent.name, input={"n": 4, "fail": [1]})
    with crash_at("start_children:after_effect"):  # started, its commit never made
        run_to_end(parent_id, retries=False)

    waiting = run_to_end(parent_id, retries=False)

    assert waiting.status == RunStatus.WAITING and waiting.waiting_for == "signal"
    assert waiting.children == {RunStatus.PENDING: 4}
    kids = children_of(parent_id)
    start_seq = kids[0].parent_seq
    assert [k.business_key for k in kids] == [f"{parent_id}:{start_seq}:{i}" for i in range(4)]
    run_to_end(parent_id, retries=False)  # the function replayed, still waiting: nothing new
    run_children(parent_id)

    done = run_to_end(parent_id)

    assert done.status == RunStatus.COMPLETED, done.error
    assert done.output == {
        "children": [k.id for k in kids],
        "counts": {RunStatus.COMPLETED: 3, RunStatus.FAILED: 1},
        "ended": 4,
    }
    assert done.children == {RunStatus.COMPLETED: 3, RunStatus.FAILED: 1}
    assert WorkflowRun.objects.filter(parent_id=parent_id).count() == 4
    assert durable.snapshot(kids[0].id).parent == parent_id  # type: ignore[union-attr]


def test_parent__a_forged_children_report__refused_the_wait_still_counts() -> None:
    parent_id = durable.start(workflows.family.name, input={"n": 2})
    waiting = run_to_end(parent_id, retries=False)
    assert waiting.status == RunStatus.WAITING

    with pytest.raises(InvalidInputError, match="'children:' are reserved"):
        durable.signal(parent_id, "children:1", {"counts": {}}, signal_id="forged")

    assert run_to_end(parent_id, retries=False).status == RunStatus.WAITING


def test_parent__children_that_ended_before_it_waits__it_does_not_wait() -> None:
    parent_id = durable.start(workflows.family.name, input={"n": 3})
    with capture_messages():
        runtime.run_step(parent_id, 1)  # starts them; its wait comes next
    run_children(parent_id)

    done = run_to_end(parent_id)

    assert done.status == RunStatus.COMPLETED
    assert done.children == {RunStatus.COMPLETED: 3}


def test_parent__crash_after_starting_before_its_checkpoint__adopts_the_same_children() -> None:
    parent_id = durable.start(workflows.family.name, input={"n": 4})
    with crash_at("start_kids:after_effect"):
        waiting = run_to_end(parent_id, retries=False)

    assert waiting.status == RunStatus.WAITING
    assert WorkflowRun.objects.filter(parent_id=parent_id).count() == 4
    start = next(s for s in waiting.steps if s.name == "start_kids")
    assert sorted(start.output["children"]) == sorted(k.id for k in children_of(parent_id))
    run_children(parent_id)
    assert run_to_end(parent_id).status == RunStatus.COMPLETED


def test_parent__a_lost_doorbell__the_recheck_finds_its_children_ended() -> None:
    parent_id = durable.start(workflows.family.name, input={"n": 2})
    run_to_end(parent_id, retries=False)
    with capture_messages():  # the children's rings are dropped: their workers "died"
        for kid in children_of(parent_id):
            run_to_end(kid.id)
    parent = WorkflowRun.objects.get(pk=parent_id)
    assert parent.status == RunStatus.WAITING
    # The recheck is its wake-up time (the sweeper publishes it then): not a day away.
    assert (parent.wake_at - parent.updated_at).total_seconds() <= 31  # type: ignore[operator]

    runtime.run_step(parent_id, parent.current_seq)  # what the sweeper's message does

    assert run_to_end(parent_id).status == RunStatus.COMPLETED


def test_parent_waiting_for_the_first__goes_on_with_that_childs_output() -> None:
    parent_id = durable.start(workflows.first_of.name, input={"n": 3})
    run_to_end(parent_id, retries=False)
    first = children_of(parent_id)[1]
    with capture_messages() as outbox:
        run_to_end(first.id)
    with capture_messages():
        runtime.run_step(parent_id, outbox.for_run(parent_id)[0].seq)

    done = run_to_end(parent_id)

    assert done.status == RunStatus.COMPLETED
    report = next(s for s in done.steps if s.name == "wait_kids").output["payload"]
    assert [c["run_id"] for c in report["children"]] == [first.id]
    assert report["children"][0]["output"] is not None
    # It left the others: they are still to run.
    assert done.children == {RunStatus.COMPLETED: 1, RunStatus.PENDING: 2}


def test_parent_cancelled_halfway__unfinished_children_cancelled_and_undone__finished_kept() -> (
    None
):
    parent_id = durable.start(workflows.family.name, input={"n": 4})
    run_to_end(parent_id, retries=False)
    kids = children_of(parent_id)
    run_to_end(kids[0].id)  # finished before the cancel: it stays COMPLETED
    with capture_messages():
        runtime.run_step(kids[1].id, 1)  # its effect made: the cancel undoes it

    with capture_messages():
        durable.cancel(parent_id, actor="ops", reason="flight restored")
    # At once, in the operator's request: the children that never ran are cancelled already.
    assert {WorkflowRun.objects.get(pk=k.id).status for k in kids[2:]} == {RunStatus.CANCELLED}
    parent = run_to_end(parent_id)
    for kid in kids[1:]:
        run_to_end(kid.id)

    assert parent.status == RunStatus.CANCELLED
    statuses = {k.id: durable.snapshot(k.id).status for k in kids}  # type: ignore[union-attr]
    assert statuses[kids[0].id] == RunStatus.COMPLETED
    assert {statuses[k.id] for k in kids[1:]} == {RunStatus.CANCELLED}
    # Money: the cancelled child that had acted was undone, once; the others never acted.
    undone: dict[str, Any] = {
        k: n for k, n in partner.effects().items() if k.startswith(f"{kids[1].id}_")
    }
    assert sorted(undone.values()) == [1, 1]
    for kid in kids[2:]:
        assert not [k for k in partner.effects() if k.startswith(f"{kid.id}_")]


# --- an agent parent says its children's fate ---------------------------------------------------
def fated_parent(fate: str, *, charged: int = 2, gated: int = 2, fail: bool = False) -> str:
    """An agent parent at its wait for its children (`fail`: at its wait for `go`), each child
    at its own wait for `go`: the charged ones after their effect, the gated ones before it."""
    parent_id = durable.start(
        workflows.fated_agent.name,
        input={"fate": fate, "charged": charged, "gated": gated, "fail": fail},
    )
    waiting = run_to_end(parent_id, retries=False)
    assert waiting.status == RunStatus.WAITING, waiting.error
    with capture_messages():
        for kid in children_of(parent_id):
            assert run_to_end(kid.id, retries=False).status == RunStatus.WAITING
    return parent_id


def partner_counts(run_id: str) -> list[int]:
    """How many times each effect under the run's keys was made at the partner stand-in."""
    return sorted(n for key, n in partner.effects().items() if key.startswith(f"{run_id}_"))


def assert_cancelled_and_undone_once(parent_id: str) -> None:
    """Each child CANCELLED by one cancel; a charged one's effect undone once, a gated one
    never charged."""
    for kid in children_of(parent_id):
        assert durable.snapshot(kid.id).status == RunStatus.CANCELLED  # type: ignore[union-attr]
        cancels = RunEvent.objects.filter(run_id=kid.id, kind=RunEvent.Kind.OPERATOR_CANCEL)
        assert cancels.count() == 1
        assert cancels.get().actor == f"parent {parent_id}"
        charged = kid.workflow == workflows.charged_kid.name
        assert partner_counts(kid.id) == ([1, 1] if charged else [])  # made and undone, once


def test_agent_parent_cancelled__fate_cancel__charged_children_undone_the_others_cancelled() -> (
    None
):
    parent_id = fated_parent("cancel")

    with capture_messages():
        durable.cancel(parent_id, actor="ops", reason="flight restored")
    # At once, in the operator's request: the children that never charged are cancelled.
    kids = children_of(parent_id)
    gated = [k for k in kids if k.workflow == workflows.gated_kid.name]
    assert {WorkflowRun.objects.get(pk=k.id).status for k in gated} == {RunStatus.CANCELLED}
    parent = run_to_end(parent_id)
    for kid in kids:
        run_to_end(kid.id)

    assert parent.status == RunStatus.CANCELLED, parent.error
    assert_cancelled_and_undone_once(parent_id)
    # The parent's compensation ran too, and cancelled none again: the charged children were
    # still undoing, the others had ended.
    [undo] = [s for s in parent.steps if s.name.startswith("cancel_kids")]
    assert undo.output["cancelled"] == []
    assert sorted(undo.output["refused"]) == sorted(k.id for k in kids if k not in gated)


def test_agent_parent_failed__fate_cancel__its_compensation_cancels_the_children() -> None:
    parent_id = fated_parent("cancel", fail=True)
    durable.signal(parent_id, "go", signal_id="parent-go")

    parent = run_to_end(parent_id)
    for kid in children_of(parent_id):
        run_to_end(kid.id)

    assert parent.status == RunStatus.FAILED
    assert "the parent gave up" in parent.error
    assert_cancelled_and_undone_once(parent_id)
    [undo] = [s for s in parent.steps if s.name.startswith("cancel_kids")]
    assert sorted(undo.output["cancelled"]) == sorted(k.id for k in children_of(parent_id))


@pytest.mark.parametrize("point", ["after_claim", "after_effect"])
def test_agent_parent_failed__crash_in_its_compensation__each_child_cancelled_once(
    point: str,
) -> None:
    parent_id = fated_parent("cancel", fail=True)
    durable.signal(parent_id, "go", signal_id="parent-go")

    with crash_at(f"cancel_kids:{point}"):  # after_effect: the children's cancels committed
        parent = run_to_end(parent_id)
    for kid in children_of(parent_id):
        run_to_end(kid.id)

    assert parent.status == RunStatus.FAILED
    assert_cancelled_and_undone_once(parent_id)


def test_agent_parent_cancelled__the_request_died_before_the_children__compensation_cancels() -> (
    None
):
    parent_id = fated_parent("cancel")
    # The operator's request committed the parent's cancel and died before its children's.
    store.run_cancel(parent_id, actor="ops", reason="flight restored")
    assert {k.status for k in children_of(parent_id)} == {RunStatus.WAITING}

    parent = run_to_end(parent_id)
    for kid in children_of(parent_id):
        run_to_end(kid.id)

    assert parent.status == RunStatus.CANCELLED
    assert_cancelled_and_undone_once(parent_id)


@pytest.mark.parametrize("fail", [False, True], ids=["cancelled", "failed"])
def test_agent_parent_stopped__fate_leave__the_children_go_on_and_complete(fail: bool) -> None:
    parent_id = fated_parent("leave", fail=fail)
    if fail:
        durable.signal(parent_id, "go", signal_id="parent-go")
    else:
        with capture_messages():
            durable.cancel(parent_id, actor="ops", reason="flight restored")

    parent = run_to_end(parent_id)

    assert parent.status == (RunStatus.FAILED if fail else RunStatus.CANCELLED)
    assert not [s for s in parent.steps if s.name.startswith("cancel_kids")]
    kids = children_of(parent_id)
    assert {k.status for k in kids} == {RunStatus.WAITING}  # left as they were
    for kid in kids:
        durable.signal(kid.id, "go", signal_id=f"{kid.id}-go")
        assert run_to_end(kid.id).status == RunStatus.COMPLETED
        assert partner_counts(kid.id) == [1]  # its effect made once, and kept


@pytest.mark.parametrize(
    ("fate", "says"),
    [("unsaid", "says what happens to the children"), ("unknown", "declares none of that name")],
)
def test_agent_parent__a_start_without_a_fate_it_declares__fails_before_starting_any(
    fate: str, says: str
) -> None:
    parent_id = durable.start(workflows.fated_agent.name, input={"fate": fate, "charged": 1})

    failed = run_to_end(parent_id)

    assert failed.status == RunStatus.FAILED
    assert says in failed.error
    assert not children_of(parent_id)


def test_graph_step__start_children_with_compensate__refused_the_step_declares_it() -> None:
    ctx = StepContext(
        run_id="wf_x",
        workflow="family_parent",
        seq=1,
        step="start_kids",
        attempt=1,
        input={},
        load_outputs=dict,
    )

    with pytest.raises(DefinitionError, match="a graph step declares what undoes it"):
        durable.start_children(ctx, [(workflows.kid.name, {}, None)], compensate=None)

    assert not WorkflowRun.objects.exists()
