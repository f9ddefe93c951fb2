"""Many runs at once meet priorities and concurrency keys (issue 40), in this process against
real Postgres: `start_many` and `start_children` give each run the priority `start` would (the
one given, else its workflow's) and publish its first step with it; a run whose workflow
declares a concurrency key goes through the same admission as one started alone, decided for
the whole list in a few statements: over its key's cap it is created WAITING with the reason,
publishes nothing, and is admitted in the order given when a place frees."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow.exceptions import InvalidInputError
from agentflow.models import RunEvent, WorkflowRun
from agentflow.testing import capture_messages
from tests.support import workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

KEYED = workflows.keyed_quick.name


def statuses(ids: list[str]) -> list[str]:
    found = dict(WorkflowRun.objects.filter(pk__in=ids).values_list("id", "status"))
    return [found[run_id] for run_id in ids]


def test_start_many__priority_given__on_every_row_and_every_first_message() -> None:
    with capture_messages() as outbox:
        ids = durable.start_many(
            [(workflows.one_read.name, {"n": n}, None) for n in range(3)], priority=2
        )
        plain = durable.start_many([(workflows.one_read.name, {"n": "plain"}, None)])

    assert set(WorkflowRun.objects.filter(pk__in=ids).values_list("priority", flat=True)) == {2}
    assert WorkflowRun.objects.get(pk=plain[0]).priority is None
    assert [(m.run_id, m.priority) for m in outbox.messages] == [
        *[(run_id, 2) for run_id in ids],
        (plain[0], None),
    ]
    with pytest.raises(InvalidInputError):
        durable.start_many([(workflows.one_read.name, {}, None)], priority=10)


def test_start_many__over_the_key_cap__waiting_with_the_reason__admitted_in_the_order_given() -> (
    None
):
    holder = durable.start(KEYED, input={"key": "A"})
    with capture_messages() as outbox:
        ids = durable.start_many(
            [(KEYED, {"key": key}, None) for key in ("A", "B", "A", "C", "B")], priority=3
        )
    a1, b1, a2, c1, b2 = ids

    assert statuses(ids) == [
        RunStatus.WAITING,
        RunStatus.PENDING,
        RunStatus.WAITING,
        RunStatus.PENDING,
        RunStatus.WAITING,
    ]
    assert [m.run_id for m in outbox.messages] == [b1, c1]  # the waiting publish nothing
    for waiting in (a1, a2, b2):
        snapshot = durable.snapshot(waiting)
        assert snapshot is not None and "same concurrency key" in snapshot.held
        assert RunEvent.objects.filter(run_id=waiting, kind=RunEvent.Kind.HELD).count() == 1
    rows = WorkflowRun.objects.filter(pk__in=ids)
    assert {(r.priority, r.concurrency_limit) for r in rows} == {(3, 1)}
    assert len({r.concurrency_key for r in rows}) == 3  # A, B, C: HMACs, never the text
    assert "A" not in {r.concurrency_key for r in rows}

    # The holder ends: A's first waiter is admitted, with its priority; the second still waits.
    with capture_messages() as outbox:
        durable.cancel(holder, actor="test", reason="make room")
    assert statuses([a1, a2]) == [RunStatus.PENDING, RunStatus.WAITING]
    assert [(m.run_id, m.priority) for m in outbox.messages] == [(a1, 3)]
    assert RunEvent.objects.filter(run_id=a1, kind=RunEvent.Kind.RELEASED).exists()
    # And B's first ends: B's waiter is admitted.
    with capture_messages() as outbox:
        durable.cancel(b1, actor="test", reason="make room")
    assert statuses([b2]) == [RunStatus.PENDING]
    assert [m.run_id for m in outbox.messages] == [b2]


def test_start_many__keys_of_a_thousand_runs__decided_in_a_handful_of_statements() -> None:
    durable.start(KEYED, input={"key": "k-7"})  # holds one key of the thousand
    runs = [(KEYED, {"key": f"k-{i}"}, f"bulk-{i}") for i in range(1000)]
    with (
        capture_messages() as outbox,
        CaptureQueriesContext(connection) as queries,
        transaction.atomic(),
    ):
        ids = durable.start_many(runs)

    writes = [
        q for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]
    # The key locks, their counts, the runs, their ids, the waiting one's event: not a
    # statement per run.
    assert len(writes) <= 8, [q["sql"][:80] for q in writes]
    assert len(outbox) == 999
    assert statuses(ids).count(RunStatus.WAITING) == 1
    assert WorkflowRun.objects.get(pk=ids[7]).status == RunStatus.WAITING


def test_start_many__again_with_the_same_business_keys__no_second_run_no_second_event() -> None:
    holder = durable.start(KEYED, input={"key": "A"})
    first = durable.start_many([(KEYED, {"key": "A"}, "a-1"), (KEYED, {"key": "B"}, "b-1")])
    with capture_messages() as outbox:
        again = durable.start_many([(KEYED, {"key": "A"}, "a-1"), (KEYED, {"key": "B"}, "b-1")])

    assert again == first
    assert len(outbox) == 0
    assert RunEvent.objects.filter(run_id=first[0], kind=RunEvent.Kind.HELD).count() == 1
    assert statuses([holder, *first]) == [RunStatus.PENDING, RunStatus.WAITING, RunStatus.PENDING]


def test_start_many__a_key_given_twice_is_one_run__a_place_it_did_not_take_is_handed_on() -> None:
    """The same business key twice in one list is one run; and where a run that took its
    key's place already existed (and ended), the runs created behind it in the same list are
    admitted once the start commits, not left behind a place nobody holds."""
    [old] = durable.start_many([(KEYED, {"key": "A"}, "a-old")])
    durable.cancel(old, actor="test", reason="ended before the list came again")
    with capture_messages() as outbox:
        ids = durable.start_many(
            [
                (KEYED, {"key": "A"}, "a-old"),
                (KEYED, {"key": "A"}, "a-new"),
                (KEYED, {"key": "A"}, "a-new"),
            ]
        )

    assert ids[0] == old and ids[1] == ids[2]
    assert statuses([old, ids[1]]) == [RunStatus.CANCELLED, RunStatus.PENDING]
    assert [m.run_id for m in outbox.messages] == [ids[1]]
    assert RunEvent.objects.filter(run_id=ids[1], kind=RunEvent.Kind.HELD).count() == 1
    assert RunEvent.objects.filter(run_id=ids[1], kind=RunEvent.Kind.RELEASED).count() == 1
