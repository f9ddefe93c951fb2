"""Fee waivers wait for an operator (issue 18), in both engines, with real worker processes and
the real sandbox, counted at its ledger.

A customer who asks to have the change fee waived for a reason the policy considers gets a
waiver that waits for our team's approval before the seat or the card is touched: approved, the
change is made with no fee held or taken and one boarding pass; rejected, or not decided in
time, the normal fee is held and taken once; the customer is told which on the status page and
in the e-mail. The money invariant (docs/protocol.md, "I8: money") is checked at the partner on
every path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import Client

from agentflow import durable
from agentflow.testing.processes import WorkerProcess
from agentflow.testing.waiting import wait_for
from refunds import policy, waivers
from refunds.models import RefundRequest
from tests.support.refunds import (
    finished,
    holds_left,
    money_kept,
    partner_effects,
    refund_worker_env,
    seat_held,
    submit,
)
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

ENGINES = ["graph", "agent"]
DETAILS = "My mother died on Monday; the funeral is on the day of my flight."
OPERATOR = "ops@skyways.example"
StartWorker = Callable[..., WorkerProcess]


@pytest.fixture
def start_worker(
    clean_sandbox: SandboxProcess, transactional_db: None, settings: Any
) -> Iterator[StartWorker]:
    """One worker (with its beat, the sweeper) running refunds in `engine`; SIGKILLed at
    teardown, before the test database is flushed."""
    started: list[WorkerProcess] = []

    def start(engine: str, **env: str) -> WorkerProcess:
        settings.REFUNDS_ENGINE = engine  # what `submit` starts, here as in the worker
        worker = WorkerProcess(
            concurrency=2,
            env=refund_worker_env(clean_sandbox, REFUNDS_ENGINE=engine, **env),
            beat=True,
        )
        started.append(worker)
        return worker.start(timeout=60)

    try:
        yield start
    finally:
        for worker in started:
            worker.kill()


def waiting_for_approval(run_id: str, worker: WorkerProcess) -> durable.RunSnapshot:
    def waiting() -> durable.RunSnapshot | None:
        assert worker.alive(), worker.log_tail()
        run = durable.snapshot(run_id)
        assert run is not None and not run.finished, run
        return run if run.waiting_for == "approval" else None

    return wait_for(waiting, timeout=60, what=f"run {run_id} to wait for approval")


def status_json(run_id: str) -> dict[str, Any]:
    refund = RefundRequest.objects.get(workflow_id=run_id)
    return Client().get(f"/refunds/{refund.public_id}/status.json").json()


def ask_for_a_waiver(reference: str, worker: WorkerProcess, sandbox: SandboxProcess) -> str:
    """Submit a bereavement waiver and check it waits, with nothing done at any partner."""
    run_id = submit(reference, waiver_reason="bereavement", waiver_details=DETAILS)
    run = waiting_for_approval(run_id, worker)

    assert run.pending_approval is not None
    assert run.pending_approval["call"] == waivers.STEP
    assert run.pending_approval["arguments"]["reason"] == "bereavement"
    ledger = partner_effects(sandbox, run_id)
    assert ledger["seat_cancellations"] == [] and ledger["boarding_passes"] == []
    assert ledger["authorizations"] == [] and ledger["payments"] == []
    assert ledger["emails"] == []
    assert seat_held(sandbox, reference)
    page = status_json(run_id)
    assert page["waiting_for"] == "approval"
    assert page["customer"]["outcome"] == "awaiting_approval"
    assert page["customer"]["final"] is False
    assert "waiting for our team" in page["customer"]["headline"]
    [row] = [s for s in page["customer"]["steps"] if s["name"] == waivers.STEP]
    assert row["state_label"] == "Waiting for our team"
    return run_id


@pytest.mark.parametrize("engine", ENGINES)
def test_approved_waiver__rebooked_with_no_fee_and_one_boarding_pass(
    engine: str, start_worker: StartWorker, clean_sandbox: SandboxProcess
) -> None:
    reference = f"WVA{engine[0].upper()}01"
    worker = start_worker(engine)
    run_id = ask_for_a_waiver(reference, worker, clean_sandbox)

    durable.approve(run_id, actor=OPERATOR, reason="We're sorry for your loss.")
    run = finished(run_id, worker, timeout=90)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    ledger = partner_effects(clean_sandbox, run_id)
    assert ledger["authorizations"] == [] and ledger["payments"] == []  # no fee, not even held
    assert money_kept(ledger) == 0 and holds_left(ledger) == []
    assert len(ledger["seat_cancellations"]) == 1
    assert len(ledger["boarding_passes"]) == 1
    [email] = ledger["emails"]
    assert "Change fee:     none: our team waived it" in email["body"]
    assert "Fee waiver: approved by our team, so there is no change fee." in email["body"]
    page = status_json(run_id)
    assert page["waiting_for"] is None
    assert page["customer"]["outcome"] == "completed"
    assert "Change fee: none, our team waived it" in page["customer"]["details"]


@pytest.mark.parametrize("engine", ENGINES)
def test_rejected_waiver__completed_with_the_fee_charged_once_and_the_chosen_sentence_told(
    engine: str, start_worker: StartWorker, clean_sandbox: SandboxProcess
) -> None:
    reference = f"WVR{engine[0].upper()}01"
    worker = start_worker(engine)
    run_id = ask_for_a_waiver(reference, worker, clean_sandbox)
    told = policy.WAIVER_REPLIES["reject"][2]  # the operator chose it; their reason is theirs

    durable.reject(run_id, actor=OPERATOR, reason="We need a death certificate", reply=told)
    run = finished(run_id, worker, timeout=90)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    ledger = partner_effects(clean_sandbox, run_id)
    [payment] = ledger["payments"]
    assert payment["amount"] == 4500
    assert money_kept(ledger) == 4500 and holds_left(ledger) == []
    assert len(ledger["authorizations"]) == 1 and ledger["refunds"] == []
    assert len(ledger["boarding_passes"]) == 1
    [email] = ledger["emails"]
    assert "Change fee:     $45.00, charged" in email["body"]
    assert told in email["body"] and "death certificate" not in email["body"]
    details = status_json(run_id)["customer"]["details"]
    assert "Change fee: $45, charged to your card" in details
    assert told in details and not any("death certificate" in line for line in details)


@pytest.mark.parametrize("engine", ENGINES)
def test_waiver_nobody_decides__times_out_to_the_fee_path_and_says_so(
    engine: str, start_worker: StartWorker, clean_sandbox: SandboxProcess
) -> None:
    """AGENTFLOW_APPROVAL_TIMEOUT (48 h) shortened to a few seconds in the worker: the sweeper
    wakes the run at its deadline, and the waiver is rejected as timed out."""
    reference = f"WVT{engine[0].upper()}01"
    worker = start_worker(engine, AGENTFLOW_APPROVAL_TIMEOUT="3")
    run_id = submit(reference, waiver_reason="medical", waiver_details=DETAILS)

    run = finished(run_id, worker, timeout=90)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    ledger = partner_effects(clean_sandbox, run_id)
    assert money_kept(ledger) == 4500 and holds_left(ledger) == []
    assert len(ledger["payments"]) == 1 and len(ledger["boarding_passes"]) == 1
    [email] = ledger["emails"]
    assert "couldn't review your request in time" in email["body"]
    assert any("in time" in line for line in status_json(run_id)["customer"]["details"])


@pytest.mark.parametrize("engine", ENGINES)
def test_worker_killed_while_the_waiver_waits__the_approval_reaches_a_fresh_worker(
    engine: str, start_worker: StartWorker, clean_sandbox: SandboxProcess
) -> None:
    """A wait holds no worker: the whole worker SIGKILLed while the waiver waits loses nothing,
    and the approval given meanwhile is carried out once by the next worker."""
    reference = f"WVK{engine[0].upper()}01"
    first = start_worker(engine)
    run_id = ask_for_a_waiver(reference, first, clean_sandbox)
    first.kill()

    durable.approve(run_id, actor=OPERATOR, reason="Approved while the workers were down")
    run = finished(run_id, start_worker(engine), timeout=90)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    ledger = partner_effects(clean_sandbox, run_id)
    assert ledger["authorizations"] == [] and ledger["payments"] == []
    assert [len(ledger[kind]) for kind in ("seat_cancellations", "boarding_passes")] == [1, 1]
    assert len(ledger["emails"]) == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_rejected_then_killed_right_after_the_charge__the_fee_held_and_taken_once(
    engine: str, start_worker: StartWorker, clean_sandbox: SandboxProcess
) -> None:
    """The `after_effect` crash on the fee path a rejection leads to: SIGKILL right after the hold
    was made, before its checkpoint. The takeover finds the hold; the fee is taken once."""
    reference = f"WVC{engine[0].upper()}01"
    worker = start_worker(
        engine, AGENTFLOW_FAULTS="1", AGENTFLOW_CRASH_AT="charge_customer:after_effect"
    )
    run_id = ask_for_a_waiver(reference, worker, clean_sandbox)

    durable.reject(run_id, actor=OPERATOR, reason="Not one of our listed cases")
    run = finished(run_id, worker, timeout=120)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    assert "fault injection: SIGKILL at charge_customer:after_effect" in worker.log_tail(400)
    ledger = partner_effects(clean_sandbox, run_id)
    assert len(ledger["authorizations"]) == 1
    [payment] = ledger["payments"]
    assert payment["amount"] == 4500 and money_kept(ledger) == 4500 and holds_left(ledger) == []
    assert [len(ledger[kind]) for kind in ("seat_cancellations", "boarding_passes")] == [1, 1]
