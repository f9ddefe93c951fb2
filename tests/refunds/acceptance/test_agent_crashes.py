"""Agent mode under real crashes (issue 9): real workers, the real `openai` SDK against a local
OpenAI-compatible server that counts requests, and the partner sandbox's ledger.

A SIGKILL after a model turn, after a tool's effect (before its checkpoint) and after its
checkpoint: no repeated request for a turn whose checkpoint committed, one effect per tool
call, and the same final state as an uninterrupted run.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from agentflow import durable
from agentflow.agent import ModelRequest
from agentflow.models import StepCheckpoint
from agentflow.testing.waiting import wait_for
from refunds import engines
from refunds.agent.planner import plan_refund
from refunds.agent.prompts import read_first_user_message
from tests.support.agent_workers import AgentWorker
from tests.support.airline_days import new_flight
from tests.support.engine import stopped
from tests.support.llm_server import LLMServer, SeenRequest, fail, planned_by, tool_calls
from tests.support.refunds import finished, holds_left, money_kept, partner_effects, submit
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

EFFECTS = (
    "authorizations",
    "payments",
    "seat_cancellations",
    "boarding_passes",
    "crm_updates",
    "emails",
)


def trajectory(run_id: str) -> list[str]:
    return list(
        StepCheckpoint.objects.filter(run_id=run_id).order_by("seq").values_list("name", flat=True)
    )


def requests_per_turn(server: LLMServer) -> Counter[int]:
    return Counter(seen.turn for seen in server.requests)


def test_uninterrupted__six_turns_one_request_each_one_effect_each(
    agent_worker: AgentWorker, llm_server: LLMServer, clean_sandbox: SandboxProcess
) -> None:
    worker = agent_worker()
    run_id = submit("AGU001")

    run = finished(run_id, worker, timeout=60)

    assert run.workflow == engines.AGENT
    assert run.status == durable.RunStatus.COMPLETED, run.error
    assert trajectory(run_id) == UNINTERRUPTED
    assert requests_per_turn(llm_server) == dict.fromkeys(range(1, 7), 1)
    ledger = partner_effects(clean_sandbox, run_id)
    assert all(len(ledger[kind]) == 1 for kind in EFFECTS)
    assert ledger["refunds"] == []
    assert run.output.startswith(f"You're booked on SK1240 on {new_flight().date}, seat ")


#: What an uninterrupted refund agent run records, in order.
UNINTERRUPTED = [
    "verify_ownership",
    "check_flight",
    "llm",
    "load_request",
    "llm",
    "fetch_booking",
    "check_cancellation_policy",
    "llm",
    "charge_customer",
    "cancel_seat",
    "llm",
    "issue_boarding_pass",
    "llm",
    "update_crm",
    "send_confirmation_email",
    "llm",
    "capture_fee",
]

#: crash point -> requests per model turn the server must see.
CRASHES = {
    "llm:after_effect": 2,  # the answer was lost with the process: that turn is asked again
    "llm:after_complete": 1,  # the turn was recorded: never asked again
    "charge_customer:after_effect": 1,  # the charge made, not recorded: reconciled, not repeated
    "charge_customer:after_complete": 1,
    "capture_fee:after_effect": 1,  # the fee taken in code, not recorded: found, not taken again
}


@pytest.mark.parametrize("point", list(CRASHES))
def test_sigkill__resumes_without_asking_again_or_acting_twice(
    point: str, agent_worker: AgentWorker, llm_server: LLMServer, clean_sandbox: SandboxProcess
) -> None:
    worker = agent_worker(AGENTFLOW_FAULTS="1", AGENTFLOW_CRASH_AT=point)
    run_id = submit("AGC001")

    run = finished(run_id, worker, timeout=90)

    assert f"fault injection: SIGKILL at {point}" in worker.log_tail(2000)
    assert run.status == durable.RunStatus.COMPLETED, run.error
    assert trajectory(run_id) == UNINTERRUPTED  # the same final state as an uninterrupted run
    assert requests_per_turn(llm_server) == dict.fromkeys(range(1, 7), CRASHES[point])
    ledger = partner_effects(clean_sandbox, run_id)
    assert all(len(ledger[kind]) == 1 for kind in EFFECTS), {k: len(ledger[k]) for k in EFFECTS}
    assert ledger["refunds"] == []
    assert run.output.startswith(f"You're booked on SK1240 on {new_flight().date}, seat ")


# --- divergence, then a fork ----------------------------------------------------------------
def test_deploy_changes_turn_3__parked_with_the_diff__fork_from_it_completes_with_one_payment(
    agent_worker: AgentWorker, llm_server: LLMServer, clean_sandbox: SandboxProcess
) -> None:
    """The first worker runs three turns (the seat cancelled and the fee charged), then the
    model service fails turn 4 and the worker is killed. A deploy that changed what the model is
    shown of a booking (no version bump) resumes it: turn 3's request no longer matches the one
    recorded, so the run is parked with the diff, not replayed against the wrong history. An
    operator forks from turn 3: the new branch asks turn 3 again, reuses the seat cancellation
    and the charge (the same calls with the same arguments), and completes, one payment."""
    planner = planned_by(plan_refund)
    llm_server.script(lambda seen: fail(503) if seen.turn == 4 and not resumed else planner(seen))
    resumed = False
    first = agent_worker()
    run_id = submit("AGD001")
    wait_for(lambda: any(seen.turn == 4 for seen in llm_server.requests), what="turn 4")
    first.kill()  # its back-off message dies with it
    resumed = True
    agent_worker(AGENTFLOW_WORKFLOW_MODULES="tests.refunds.acceptance.agent_deploy")

    parked = stopped(run_id, timeout=60)

    turn_3 = UNINTERRUPTED.index("llm", UNINTERRUPTED.index("check_cancellation_policy")) + 1
    assert parked.status == durable.RunStatus.NEEDS_ATTENTION
    assert parked.error.startswith(
        f"diverged from its recorded history: Position {turn_3} diverged"
    )
    assert ".seat: " in parked.error  # the diff names what changed
    held = partner_effects(clean_sandbox, run_id)["authorizations"]
    assert len(held) == 1

    durable.fork(run_id, position=turn_3, actor="ops", reason="the deploy changed turn 3")
    run = stopped(run_id, timeout=60)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    ledger = partner_effects(clean_sandbox, run_id)
    assert [a["id"] for a in ledger["authorizations"]] == [h["id"] for h in held]  # reused
    assert all(len(ledger[kind]) == 1 for kind in EFFECTS)
    assert ledger["refunds"] == []


# --- guardrails, enforced by code ---------------------------------------------------------------
def _turn_3_calls(seen: SeenRequest) -> tuple[str, str]:
    """This run's refund id and booking reference, read back from its first turns."""
    request = ModelRequest(model="", messages=tuple(seen.messages))
    refund_id, _ = read_first_user_message(
        next(m for m in request.messages if m.get("role") == "user")["content"]
    )
    return refund_id, "AGG001"


@pytest.mark.parametrize("greed", ["one cent", "twice", "for ever"])
def test_guardrails__a_model_that_charges_wrong_twice_or_loops__no_money_beyond_the_fee(
    greed: str, agent_worker: AgentWorker, llm_server: LLMServer, clean_sandbox: SandboxProcess
) -> None:
    planner = planned_by(plan_refund)

    def script(seen: SeenRequest) -> Any:
        if greed == "for ever":
            refund_id, _ = _turn_3_calls(seen)
            return tool_calls(("load_request", {"refund_id": refund_id}))
        if greed == "one cent" and seen.turn == 3:
            refund_id, reference = _turn_3_calls(seen)
            return tool_calls(
                ("cancel_seat", {"booking_reference": reference}),
                ("charge_customer", {"refund_id": refund_id, "amount_cents": 1}),
            )
        if greed == "twice" and seen.turn == 4:
            refund_id, _ = _turn_3_calls(seen)
            return tool_calls(("charge_customer", {"refund_id": refund_id, "amount_cents": 4500}))
        return planner(seen)

    llm_server.script(script)
    worker = agent_worker(AGENTFLOW_AGENT_MAX_TURNS="4")
    run_id = submit("AGG001")

    run = stopped(run_id, timeout=60)

    assert run.status == durable.RunStatus.FAILED
    reason = {
        "one cent": "charge_customer: We stopped this change: our automated assistant asked to "
        "charge $0.01, but the change fee",
        "twice": "The agent used all 4 of its model turns without finishing.",
        "for ever": "The agent used all 4 of its model turns without finishing.",
    }[greed]
    assert run.error.startswith(reason), run.error
    if greed == "twice":  # the second charge was refused (the model was told), not made
        charges = StepCheckpoint.objects.filter(run_id=run_id, name="charge_customer")
        outputs = [cp.output for cp in charges.order_by("seq")]
        assert [o["ok"] for o in outputs] == [True, False]
        assert outputs[1]["result"]["error"] == "limit_reached"
    ledger = partner_effects(clean_sandbox, run_id)
    assert money_kept(ledger) == 0  # nothing kept: never taken, or the one fee given back
    assert holds_left(ledger) == []
    assert ledger["payments"] == []  # the fee is taken only after an answer with a pass
    assert worker.alive()
