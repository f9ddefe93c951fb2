"""Claims and fences against real Postgres, in this process: a worker that loaded a run before an
operator acted (a cancel, a fork) changes nothing after it, a replay that fails over a recorded
call parks instead of looping, and a claim knows which database server its lock was held on.

A "stale worker" is played in two phases with the calls the runtime makes: it loads the run
(`store.state_load`), the operator acts, then it claims or writes with what it loaded."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import transaction

from agentflow import durable, runtime, store
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow.states import RunStatus
from tests.acceptance import workflows
from tests.support import partner

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def _names(run_id: str) -> list[str]:
    return list(
        StepCheckpoint.objects.filter(run_id=run_id).order_by("seq").values_list("name", flat=True)
    )


# --- finding 4: a worker that loaded the run before a cancel ----------------------------------
def test_claim__a_worker_that_loaded_the_charge_before_a_cancel__charges_nothing(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """The slow-path claim used to be fenced only on "active at seq 2", and the cancel put its
    first compensation at seq 2: the stale worker charged, and the compensation then parked
    the run as a "non-deterministic definition" that no console action could free."""
    run_id = durable.start(workflows.cancellable.name)
    runtime.run_step(run_id, 1)  # book
    stale = store.state_load(run_id, 2)  # a worker has loaded the charge...
    assert stale is not None and stale.checkpoint is None

    outcome = durable.cancel(run_id, actor="ops", reason="customer withdrew")
    charge = workflows.cancellable.steps["charge"]
    claim = store.step_claim(stale, charge, 2, stale.checkpoint)  # ...and claims after it

    assert outcome == "cancelling: undoing with unbook, notify first"
    assert claim is None
    run = drive(run_id)
    assert run.status == RunStatus.CANCELLED, run.error
    assert _names(run_id) == ["book", "unbook", "notify"]
    assert [e["step"] for e in partner.executions(run_id)] == ["book", "unbook", "notify"]
    assert len(partner.effects()) == 3  # no charge


def test_cancel__at_a_step_boundary__its_compensation_takes_a_seq_of_its_own() -> None:
    run_id = durable.start(workflows.cancellable.name)
    runtime.run_step(run_id, 1)  # book; the charge at 2 was never claimed

    durable.cancel(run_id, actor="ops", reason="customer withdrew")

    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.current_seq, run.current_step) == (3, "unbook")


def test_db_step__a_worker_that_loaded_it_before_a_cancel__writes_nothing(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.noted.name)
    runtime.run_step(run_id, 1)  # book
    stale = store.state_load(run_id, 2)
    assert stale is not None

    durable.cancel(run_id, actor="ops", reason="customer withdrew")
    note = workflows.noted.steps["note"]
    with transaction.atomic():
        written = store.unclaimed_complete(stale, workflows.noted, note, 2, None, {"noted": 1})

    assert not written
    run = drive(run_id)
    assert run.status == RunStatus.CANCELLED, run.error
    assert _names(run_id) == ["book", "unbook", "notify"]
