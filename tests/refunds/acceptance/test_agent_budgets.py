"""Budgets that hold across crashes (issue 28), with real worker processes, the real `openai`
SDK against the suite's stand-in server answering as `gpt-4o-mini` (priced by genai-prices),
and the partner sandbox's ledger.

A request is sent only when what the run spent, what its lost requests may have cost (each at
its worst: its input bounded by the tokens the server reported for the messages it shares with
a recorded request, the rest at one token per byte of its JSON, plus its `max_tokens` of
output) and what the request itself could cost stay within the cap. The caps here are derived
from recorded figures and from the very messages and tools the run sends.
"""

from __future__ import annotations

from decimal import Decimal

import genai_prices
import pytest

from agentflow import durable
from agentflow._base.canonical import canonical_json, normalise
from agentflow.agent import budget, pricing
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from refunds import steps
from refunds.agent import prompts
from refunds.agent.tools import toolbox
from tests.support.agent_workers import AgentWorker
from tests.support.engine import stopped
from tests.support.llm_server import LLMServer
from tests.support.refunds import holds_left, money_kept, partner_effects, submit
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

MODEL = "gpt-4o-mini"
MAX_OUTPUT = 200  # the max_tokens each request is sent with


def first_request_worst(run_id: str) -> Decimal:
    """The most the run's first model request can cost, from the messages it will send."""
    refund_id = WorkflowRun.objects.get(pk=run_id).input["refund_id"]
    request = steps.request_of_refund_id(refund_id)
    messages = prompts.opening_messages(request.public_id, request.message)
    worst = budget.worst_case(
        model=MODEL,
        provider="openai",
        request_bytes=budget.request_bytes(messages, toolbox.openai_tools()),
        max_tokens=MAX_OUTPUT,
    )
    assert worst.cost_usd is not None
    return worst.cost_usd


def billed(server: LLMServer) -> Decimal:
    """What the provider would bill: every answer it sent, recorded by the run or not."""
    return sum(
        (
            genai_prices.calc_price(
                genai_prices.Usage(
                    input_tokens=u["prompt_tokens"], output_tokens=u["completion_tokens"]
                ),
                u["model"],
                provider_id="openai",
            ).total_price
            for u in server.billed
        ),
        Decimal(0),
    )


def budget_event(run_id: str) -> dict[str, str]:
    [event] = RunEvent.objects.filter(run_id=run_id, data__has_key="budget")
    return event.data["budget"]


def recorded_spend(run_id: str) -> Decimal:
    turns = StepCheckpoint.objects.filter(run_id=run_id, name="llm", status="COMPLETED")
    return sum((pricing.recorded(t.output) or Decimal(0) for t in turns), Decimal(0))


def recorded_turns(run_id: str) -> list[StepCheckpoint]:
    return list(
        StepCheckpoint.objects.filter(run_id=run_id, name="llm", status="COMPLETED").order_by("seq")
    )


def first_request_bound(run_id: str, earlier: StepCheckpoint) -> int:
    """The most input tokens the run's first request can be, bounded from `earlier` (another
    run's first turn, same tools and system prompt): the tokens its server reported for its
    messages, and the bytes of this request's messages after the ones they share."""
    refund_id = WorkflowRun.objects.get(pk=run_id).input["refund_id"]
    request = steps.request_of_refund_id(refund_id)
    messages = prompts.opening_messages(request.public_id, request.message)
    recorded = earlier.arguments["arguments"]
    assert normalise(list(recorded["tools"])) == normalise(list(toolbox.openai_tools()))
    shared = 0
    for then, now in zip(recorded["messages"], messages, strict=False):
        if canonical_json(then) != canonical_json(now):
            break
        shared += 1
    assert shared >= 1  # the system prompt
    added = budget.request_bytes(messages[shared:], []) - len(canonical_json([]))
    return budget.prefix_bound(earlier.output["usage"]["prompt_tokens"], added)


def test_cap_below_what_turn_2_brings_the_run_to__turn_1_answered__parks_before_turn_2(
    agent_worker: AgentWorker, llm_server: LLMServer, clean_sandbox: SandboxProcess
) -> None:
    """The acceptance's budget: a first run with no dollar cap records what its turns cost;
    a second run, capped between its first request's worst case (bounded from the first run's
    reported tokens) and what its second turn would bring its spend to, is asked its first
    turn and parks before the second."""
    measured = submit("AGB001")
    worker = agent_worker(AGENTFLOW_LLM_MODEL=MODEL)
    assert stopped(measured, timeout=90).status == durable.RunStatus.COMPLETED
    worker.kill()
    turn_1, turn_2 = recorded_turns(measured)[:2]
    cost_1, cost_2 = pricing.recorded(turn_1.output), pricing.recorded(turn_2.output)
    assert cost_1 is not None and cost_2 is not None
    # Each request's output bound: the longest answer the script gives, and some.
    max_output = max(t.output["usage"]["completion_tokens"] for t in recorded_turns(measured)) + 8
    asked_before = len(llm_server.requests)

    run_id = submit("AGB003")
    worst_1 = budget.worst_case(
        model=MODEL,
        provider="openai",
        input_tokens=first_request_bound(run_id, turn_1),
        max_tokens=max_output,
    ).cost_usd
    assert worst_1 is not None
    by_turn_2 = cost_1 + cost_2  # what the run will have spent once turn 2 is answered
    assert worst_1 < by_turn_2, (worst_1, by_turn_2)  # a cap fits between them
    cap = (worst_1 + by_turn_2) / 2
    capped = agent_worker(
        AGENTFLOW_LLM_MODEL=MODEL,
        AGENTFLOW_LLM_MAX_OUTPUT_TOKENS=str(max_output),
        AGENTFLOW_AGENT_MAX_COST_USD=str(cap),
    )

    run = stopped(run_id, timeout=60)

    assert capped.alive()
    assert run.status == durable.RunStatus.NEEDS_ATTENTION, run.error
    assert run.error.startswith("Budget reached: $"), run.error
    assert f"past the limit of ${pricing.as_text(cap)}" in run.error
    asked = llm_server.requests[asked_before:]
    assert [seen.turn for seen in asked] == [1]  # turn 1 was asked, turn 2 never
    assert asked[0].body["max_tokens"] == max_output
    assert len(recorded_turns(run_id)) == 1
    figures = budget_event(run_id)
    assert figures["limit"] == "cost"
    assert Decimal(figures["spent_usd"]) == recorded_spend(run_id) > 0
    assert figures["lost_requests"] == 0
    assert Decimal(figures["spent_usd"]) + Decimal(figures["next_request_usd"]) > cap
    ledger = partner_effects(clean_sandbox, run_id)
    assert money_kept(ledger) == 0
    assert ledger["authorizations"] == [] and holds_left(ledger) == []
    assert ledger["seat_cancellations"] == []


def test_worker_killed_after_every_model_request__the_spend_never_passes_the_cap(
    agent_worker: AgentWorker, llm_server: LLMServer, clean_sandbox: SandboxProcess
) -> None:
    """Each turn's first request is answered and the worker killed before the answer is
    recorded (`llm:after_effect`): the provider billed it, the run never saw it. Counting each
    such request at its worst case, the run parks before a request that could take what the
    provider billed past the cap."""
    run_id = submit("AGB002")
    # Turn 1 takes two of its worst cases (its first request lost, its retry), bounded by
    # bytes (no earlier run to bound it from); later turns far less, bounded from the tokens
    # the turn before reported: the cap runs out a few turns in.
    cap = first_request_worst(run_id) * 5 / 2
    worker = agent_worker(
        AGENTFLOW_LLM_MODEL=MODEL,
        AGENTFLOW_LLM_MAX_OUTPUT_TOKENS=str(MAX_OUTPUT),
        AGENTFLOW_AGENT_MAX_COST_USD=str(cap),
        AGENTFLOW_FAULTS="1",
        AGENTFLOW_CRASH_AT="llm:after_effect",
    )

    run = stopped(run_id, timeout=90)

    assert "fault injection: SIGKILL at llm:after_effect" in worker.log_tail(2000)
    assert run.status == durable.RunStatus.NEEDS_ATTENTION, run.error
    assert run.error.startswith("Budget reached: $"), run.error
    figures = budget_event(run_id)
    lost = Decimal(figures["lost_usd"])
    assert figures["lost_requests"] >= 1
    assert Decimal(figures["spent_usd"]) == recorded_spend(run_id)
    assert Decimal(figures["spent_usd"]) + lost <= cap  # what the run counts stays within
    assert billed(llm_server) <= cap  # and so does what the provider billed, lost ones too
    assert (
        len(llm_server.billed)
        > StepCheckpoint.objects.filter(run_id=run_id, name="llm")
        .filter(status="COMPLETED")
        .count()
    )  # answers were lost
    turns = StepCheckpoint.objects.filter(run_id=run_id, name="llm")
    assert all(t.attempts <= 2 for t in turns)
