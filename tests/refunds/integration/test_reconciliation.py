"""The reconciliation's reads and matching (issue 41, docs/refunds.md "Reconciliation"): the
sandbox's Stripe lists through the real `stripe` library, page by page and by created time;
and the matching of a day's money with the runs, table-driven."""

from __future__ import annotations

import time
from datetime import date

import pytest
import requests
import stripe

from refunds import reconciliation
from refunds.gateways import PaymentGateway
from refunds.reconciliation import RunMoney
from tests.support.sandbox import SandboxProcess

KEY = "sk_test_reconcile"


def _pay(sandbox: SandboxProcess, cents: int) -> str:
    client = stripe.StripeClient(KEY, base_addresses={"api": sandbox.url})
    intent = client.v1.payment_intents.create(
        {
            "amount": cents,
            "currency": "usd",
            "payment_method": "pm_card_visa",
            "payment_method_types": ["card"],
            "confirm": True,
        }
    )
    return str(intent.id)


def test_lists__every_page_in_the_time_window(clean_sandbox: SandboxProcess) -> None:
    start = int(time.time()) - 1
    made = [_pay(clean_sandbox, cents) for cents in (1000, 2000, 3000, 4000, 5000)]
    client = stripe.StripeClient(KEY, base_addresses={"api": clean_sandbox.url})
    refund = client.v1.refunds.create({"payment_intent": made[0], "amount": 400})
    gateway = PaymentGateway(api_key=KEY, api_base=clean_sandbox.url)

    listed = gateway.payments_created(start, start + 3600, page_size=2)  # three pages

    assert [p["id"] for p in listed] == made[::-1]  # newest first, each once
    assert {p["amount_received_cents"] for p in listed} == {1000, 2000, 3000, 4000, 5000}
    assert gateway.payments_created(start - 7200, start - 3600) == []
    [back] = gateway.refunds_created(start, start + 3600, page_size=1)
    assert (back["id"], back["payment_intent_id"], back["amount_cents"]) == (
        refund.id,
        made[0],
        400,
    )
    pages = clean_sandbox.ledger()["requests"]["payment_intents.list"]
    assert pages == 3 + 1


def test_forget__a_payment_gone_from_stripe_is_no_longer_listed(
    clean_sandbox: SandboxProcess,
) -> None:
    start = int(time.time()) - 1
    kept, gone = _pay(clean_sandbox, 1500), _pay(clean_sandbox, 2500)
    answer = requests.post(f"{clean_sandbox.url}/_sandbox/forget", json={"id": gone}, timeout=10)
    assert answer.json() == {"forgotten": 1}
    gateway = PaymentGateway(api_key=KEY, api_base=clean_sandbox.url)
    assert [p["id"] for p in gateway.payments_created(start, start + 3600)] == [kept]


DAY = date(2031, 5, 4)


def run(
    run_id: str, *, taken: tuple[str, int] | None = None, given_back: tuple[str, int] | None = None
) -> RunMoney:
    return RunMoney(
        run_id=run_id,
        status="COMPLETED",
        taken={"captured": True, "payment_intent_id": taken[0], "amount_cents": taken[1]}
        if taken
        else None,
        given_back={"refunded": True, "refund_id": given_back[0], "amount_cents": given_back[1]}
        if given_back
        else None,
    )


def paid(intent: str, cents: int) -> dict:
    return {"id": intent, "amount_cents": cents, "amount_received_cents": cents}


def refunded(refund: str, cents: int) -> dict:
    return {"id": refund, "amount_cents": cents}


@pytest.mark.parametrize(
    ("payments", "refunds", "runs", "expected"),
    [
        pytest.param(
            [paid("pi_1", 5000)],
            [],
            [run("wf_1", taken=("pi_1", 5000))],
            {"matched": ["pi_1"]},
            id="clean",
        ),
        pytest.param(
            [paid("pi_x", 4200)],
            [],
            [],
            {"payment_without_run": ["pi_x"]},
            id="payment-behind-our-back",
        ),
        pytest.param(
            [],
            [],
            [run("wf_2", taken=("pi_2", 5000))],
            {"run_without_payment": ["pi_2"]},
            id="run-whose-payment-is-gone",
        ),
        pytest.param(
            [paid("pi_3", 5100)],
            [],
            [run("wf_3", taken=("pi_3", 5000))],
            {"amount_differs": ["pi_3"]},
            id="amount-differs",
        ),
        pytest.param(
            [paid("pi_4", 5000)],
            [refunded("re_4", 5000)],
            [run("wf_4", taken=("pi_4", 5000), given_back=("re_4", 5000))],
            {"matched": ["pi_4", "re_4"]},
            id="taken-and-given-back",
        ),
        pytest.param(
            [],
            [refunded("re_5", 900)],
            [],
            {"payment_without_run": ["re_5"]},
            id="refund-behind-our-back",
        ),
    ],
)
def test_match__each_side_of_the_day(payments, refunds, runs, expected) -> None:
    result = reconciliation.match(payments, refunds, runs, day=DAY)
    found = {
        kind: [entry["id"] for entry in result[kind]]
        for kind in ("matched", *reconciliation.MISMATCHES)
        if result[kind]
    }
    assert found == expected


def test_summary__names_each_mismatch_with_its_amounts() -> None:
    result = reconciliation.match(
        [paid("pi_x", 4200)], [], [run("wf_2", taken=("pi_2", 5000))], day=DAY
    )
    assert reconciliation.summary(result) == (
        "2 unmatched on 2031-05-04: payment without a completed run: pi_x, Stripe $42.00; "
        "run without its payment: pi_2 (run wf_2), run $50.00"
    )
    subject, body = reconciliation.report(result)
    assert "- run without its payment: pi_2 (run wf_2), run $50.00" in body
    assert subject == "Reconciliation 2031-05-04: 2 unmatched, waiting for an operator"
    clean = reconciliation.match([], [], [], day=DAY)
    assert reconciliation.report(clean)[0] == "Reconciliation 2031-05-04: clean, 0 matched"


def test_day_of__the_day_before_the_slot_or_the_one_given() -> None:
    assert reconciliation.day_of({"scheduled_at": "2031-05-05T02:00:00Z"}) == DAY
    assert reconciliation.day_of({"day": "2031-05-04", "scheduled_at": "x"}) == DAY
