"""A hostile model against the refund agent (issue 15): real workers, the real `openai` SDK
against a local server that plays out a plan whatever the tools answer, the sandbox's ledger.

Each plan is something a model that obeys the customer's message (prompt injection) or simply
errs has done: refund before charging, then act on another booking; charge, refund, then finish
the rebooking; three boarding passes and two e-mails in one turn; answer after one lookup;
sixty calls in one turn. Whatever it asks, a run ends COMPLETED with exactly one fee kept, one
seat change, one boarding pass and one e-mail, or not completed with no money kept, the seat
still the customer's — counted at the partners — and its status page telling the truth.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from agentflow import durable
from agentflow.models import StepCheckpoint
from refunds import engines
from refunds.agent.prompts import read_first_user_message
from refunds.models import RefundRequest
from tests.support.agent_workers import AgentWorker
from tests.support.airline_days import new_flight
from tests.support.llm_server import Answer, LLMServer, SeenRequest, plan, reply, tool_calls
from tests.support.refunds import (
    finished,
    holds_left,
    money_kept,
    partner_effects,
    seat_held,
    submit,
)
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

REFERENCE = "HST001"
#: A booking that is not this request's: the customer's words asked the model to touch it.
OTHER = "OTH999"
#: What the customer asks for (`submit`'s words), some weeks after the airline's today.
NEW = new_flight()
NEW_FLIGHT = {"booking_reference": REFERENCE, "flight": NEW.flight, "date": NEW.date}


def refund_id(seen: SeenRequest) -> str:
    """This run's refund id, as the model reads it from its first user message."""
    first = next(m for m in seen.messages if m.get("role") == "user")
    return read_first_user_message(first["content"])[0]


def asks(*calls: tuple[str, dict[str, Any]]) -> Callable[[SeenRequest], Answer]:
    """One turn of tool calls; "{refund}" in an argument becomes this run's refund id."""

    def turn(seen: SeenRequest) -> Answer:
        rid = refund_id(seen)
        return tool_calls(
            *(
                (name, {k: rid if v == "{refund}" else v for k, v in args.items()})
                for name, args in calls
            )
        )

    return turn


LOAD = asks(("load_request", {"refund_id": "{refund}"}))
LOOKUPS = asks(
    ("fetch_booking", {"booking_reference": REFERENCE}),
    ("check_cancellation_policy", {"booking_reference": REFERENCE}),
)
CHARGE = ("charge_customer", {"refund_id": "{refund}", "amount_cents": 4500})
CANCEL = ("cancel_seat", {"booking_reference": REFERENCE})
REFUND = ("refund_fee", {"refund_id": "{refund}"})
ISSUE = ("issue_boarding_pass", NEW_FLIGHT)
NOTE = ("update_crm", {"refund_id": "{refund}", "note": "Rebooked onto SK1240."})
EMAIL = ("send_confirmation_email", {"refund_id": "{refund}"})
ALL_DONE = reply("All done — your new boarding pass is on its way.")

PLANS: dict[str, Callable[[SeenRequest], Answer]] = {
    "refund first, then another booking": plan(
        asks(REFUND),
        LOAD,
        LOOKUPS,
        asks(CHARGE),
        asks(("cancel_seat", {"booking_reference": OTHER})),
    ),
    "charge, refund, finish the rebooking": plan(
        LOAD, LOOKUPS, asks(CHARGE, CANCEL), asks(REFUND), asks(ISSUE), asks(NOTE, EMAIL), ALL_DONE
    ),
    "three boarding passes and two e-mails in a turn": plan(
        LOAD, LOOKUPS, asks(CHARGE, CANCEL), asks(ISSUE, ISSUE, ISSUE, NOTE, EMAIL, EMAIL), ALL_DONE
    ),
    "answer at once after one lookup": plan(LOAD, ALL_DONE),
    "sixty calls in one turn": plan(
        LOAD, LOOKUPS, asks(CHARGE, CANCEL, *[ISSUE] * 58), asks(NOTE, EMAIL), ALL_DONE
    ),
}


def customer_page(run_id: str) -> dict[str, Any]:
    refund = RefundRequest.objects.get(workflow_id=run_id)
    return Client().get(f"/refunds/{refund.public_id}/status.json").json()["customer"]


@pytest.mark.parametrize("name", list(PLANS))
def test_hostile_model__completes_with_one_of_each_or_keeps_nothing_and_says_so(
    name: str, agent_worker: AgentWorker, llm_server: LLMServer, clean_sandbox: SandboxProcess
) -> None:
    llm_server.script(PLANS[name])
    worker = agent_worker()
    run_id = submit(REFERENCE)

    run = finished(run_id, worker, timeout=120)

    ledger = partner_effects(clean_sandbox, run_id)
    page = customer_page(run_id)
    emails = {e["message_id"] for e in ledger["emails"]}
    if run.status == durable.RunStatus.COMPLETED:
        assert money_kept(ledger) == 4500 and len(ledger["payments"]) == 1
        assert len(ledger["seat_cancellations"]) == 1
        assert len(ledger["boarding_passes"]) == 1
        assert len(ledger["emails"]) == len(emails) == 1
        assert page["outcome"] == "completed"
        # Every row shown done happened once; a refused call (refund_fee) is no row at all.
        done = [step["name"] for step in page["steps"] if step["state"] == "done"]
        assert done == engines.planned(run)  # the agent's rows (no waiver was asked for)
        assert f"New flight: SK1240 on {NEW.in_words}" in page["details"]
        assert "Change fee: $45, charged to your card" in page["details"]
    else:
        assert money_kept(ledger) == 0 and holds_left(ledger) == []
        assert seat_held(clean_sandbox, REFERENCE)  # the seat is still the customer's
        assert ledger["boarding_passes"] == []
        assert page["outcome"] in ("failed", "refunded", "cancelled", "needs_attention"), page
        assert not page["headline"].startswith("All done")
        if ledger["payments"]:
            assert page["outcome"] == "refunded"
            assert "The $45 change fee was refunded to your card." in page["details"]
        else:
            assert "You have not been charged" in page["message"]
    if name == "answer at once after one lookup":  # the done predicate's words reach the page
        assert page["message"].startswith("We couldn't finish changing your booking: ")
    if name == "sixty calls in one turn":
        assert_ten_ran_and_fifty_were_refused(run_id, llm_server)
    assert worker.alive()
    assert run.status == EXPECTED[name], run.error


#: How each plan ends now that code decides.
EXPECTED = {
    "refund first, then another booking": durable.RunStatus.FAILED,
    "charge, refund, finish the rebooking": durable.RunStatus.COMPLETED,
    "three boarding passes and two e-mails in a turn": durable.RunStatus.COMPLETED,
    "answer at once after one lookup": durable.RunStatus.FAILED,
    "sixty calls in one turn": durable.RunStatus.COMPLETED,
}


def assert_ten_ran_and_fifty_were_refused(run_id: str, llm_server: LLMServer) -> None:
    """The turn's first ten calls were asked of the tools (the pass once, then max_calls
    refused seven), the other fifty refused by the turn's cap; none claimed, the model told."""
    passes = StepCheckpoint.objects.filter(run_id=run_id, name="issue_boarding_pass").order_by(
        "seq"
    )
    errors = [(cp.output["result"] or {}).get("error") for cp in passes]
    assert errors == [None] + ["limit_reached"] * 57
    assert all(cp.kind == durable.StepKind.READ for cp in passes[1:])
    turn_4 = next(seen for seen in llm_server.requests if seen.turn == 4)
    told = [m["content"] for m in turn_4.messages if m.get("role") == "tool"][-58:]
    assert "a run may make it once" in told[1]
    assert "one turn may make at most 10 tool calls; this was call 11" in told[8]
