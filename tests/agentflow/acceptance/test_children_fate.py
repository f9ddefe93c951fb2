"""An agent parent's children meet the fate it chose (issue 40), with real worker processes:
with `compensate=` naming `durable.cancel_children`, a parent cancelled by an operator or
failing for good cancels its children still running, each ending CANCELLED, the charged ones
with their effect undone once and the others never charged; with `compensate=None` they go on
and complete. SIGKILLed between the parent's stop and its children's cancellation, each child
is still cancelled, and undone, exactly once.

The children wait for a signal (`go`) once they are where the test wants them: the charged
ones after their effect, the gated ones before it (tests/support/workflows.py, `fated_agent`).
"""

from __future__ import annotations

import pytest

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import TERMINAL_RUN_STATUSES, RunStatus
from agentflow.models import WorkflowRun
from agentflow.testing.waiting import wait_for
from tests.agentflow.acceptance.test_engine_crashes import wait_finished
from tests.agentflow.integration.test_children import (
    assert_cancelled_and_undone_once,
    children_of,
    partner_counts,
)
from tests.support import workflows
from tests.support.processes import Workers, log_has

pytestmark = pytest.mark.django_db(transaction=True)

CHARGED, GATED = 3, 3
#: Six children of a few steps each on one worker of two processes, a loaded machine.
END_SECONDS = 120.0


def parent_with_children_waiting(fate: str, *, fail: bool = False) -> str:
    """The fated parent started, and once its children all wait for `go` (the charged ones
    charged) and it waits too: for them, or (`fail`) for its own `go`."""
    parent_id = durable.start(
        workflows.fated_agent.name,
        input={"fate": fate, "charged": CHARGED, "gated": GATED, "fail": fail},
    )

    def all_waiting() -> bool:
        kids = WorkflowRun.objects.filter(parent_id=parent_id, status=RunStatus.WAITING)
        parent = WorkflowRun.objects.get(pk=parent_id)
        return parent.status == RunStatus.WAITING and kids.count() == CHARGED + GATED

    wait_for(all_waiting, timeout=END_SECONDS, interval=0.05, what="the family at its waits")
    return parent_id


def all_ended(parent_id: str) -> WorkflowRun:
    """The parent once it and every child ended."""
    parent = wait_finished(parent_id, timeout=END_SECONDS)

    def kids_ended() -> bool:
        return all(k.status in TERMINAL_RUN_STATUSES for k in children_of(parent_id))

    wait_for(kids_ended, timeout=END_SECONDS, interval=0.05, what="every child to end")
    return parent


def test_agent_parent_cancelled_by_an_operator__fate_cancel__children_cancelled_charged_undone(
    workers: Workers,
) -> None:
    workers.start(concurrency=2)
    parent_id = parent_with_children_waiting("cancel")

    durable.cancel(parent_id, actor="ops", reason="the airline restored the flight")

    parent = all_ended(parent_id)
    assert parent.status == RunStatus.CANCELLED, parent.error
    assert_cancelled_and_undone_once(parent_id)


def test_agent_parent_failed__fate_cancel__children_cancelled_charged_undone(
    workers: Workers,
) -> None:
    workers.start(concurrency=2)
    parent_id = parent_with_children_waiting("cancel", fail=True)

    durable.signal(parent_id, "go", signal_id="parent-go")  # its next call fails for good

    parent = all_ended(parent_id)
    assert parent.status == RunStatus.FAILED
    assert "the parent gave up" in parent.error
    assert_cancelled_and_undone_once(parent_id)


def test_agent_parent_cancelled__fate_leave__the_children_go_on_and_complete(
    workers: Workers,
) -> None:
    workers.start(concurrency=2)
    parent_id = parent_with_children_waiting("leave")

    durable.cancel(parent_id, actor="ops", reason="the airline restored the flight")

    assert wait_finished(parent_id, timeout=END_SECONDS).status == RunStatus.CANCELLED
    kids = children_of(parent_id)
    assert {k.status for k in kids} == {RunStatus.WAITING}  # left as they were
    for kid in kids:
        durable.signal(kid.id, "go", signal_id=f"{kid.id}-go")
    for kid in kids:
        assert wait_finished(kid.id, timeout=END_SECONDS).status == RunStatus.COMPLETED
        assert partner_counts(kid.id) == [1]  # its effect made once, and kept


@pytest.mark.parametrize("stop", ["cancelled", "failed"])
def test_sigkill_between_the_parents_stop_and_its_childrens_cancel__each_cancelled_once(
    workers: Workers, stop: str
) -> None:
    # The parent's compensation cancels the children and its worker is killed before its
    # checkpoint: the takeover runs it again, and it must cancel none twice.
    point = "cancel_kids:after_effect"
    worker = workers.start(concurrency=2, beat=True, AGENTFLOW_FAULTS="1", AGENTFLOW_CRASH_AT=point)
    parent_id = parent_with_children_waiting("cancel", fail=stop == "failed")

    if stop == "failed":
        durable.signal(parent_id, "go", signal_id="parent-go")
    else:
        # The operator's request committed the parent's cancel and died before its own
        # cancel of the children: the parent's compensation is all that cancels them.
        store.run_cancel(parent_id, actor="ops", reason="the airline restored the flight")

    parent = all_ended(parent_id)
    assert log_has(worker, f"fault injection: SIGKILL at {point}")
    assert parent.status == (RunStatus.FAILED if stop == "failed" else RunStatus.CANCELLED)
    assert_cancelled_and_undone_once(parent_id)
