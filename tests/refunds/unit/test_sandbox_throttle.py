"""The sandbox playing a limited partner (issue 27): 429 past N a second or N in flight, with the
headers a real partner sends, and the most it saw. Pure: the throttle has no sockets."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from refunds.sandbox.throttle import Throttle, partner_of


def test_rate__the_request_past_n_in_a_second_gets_a_stripe_429() -> None:
    throttle = Throttle()
    throttle.configure({"stripe": {"rate": 2}})
    answers = []
    for _ in range(3):
        with throttle.request("stripe") as refused:
            answers.append(refused)

    assert answers[:2] == [None, None]
    refusal = answers[2]
    assert refusal is not None and refusal.status == 429
    assert refusal.headers["Stripe-Rate-Limited-Reason"] == "global-rate"
    assert refusal.headers["Retry-After"] == "1"
    seen = throttle.report()["stripe"]
    assert (seen["requests"], seen["rate_limited"], seen["most_per_second"]) == (3, 1, 3)


def test_concurrency__reports_the_most_in_flight() -> None:
    throttle = Throttle()
    throttle.configure({"airline": {"concurrency": 2}})
    with ExitStack() as stack:
        answers = [stack.enter_context(throttle.request("airline")) for _ in range(3)]

    assert answers[0] is None and answers[1] is None
    assert answers[2] is not None and answers[2].status == 429
    assert "Stripe-Rate-Limited-Reason" not in answers[2].headers
    assert throttle.report()["airline"]["most_in_flight"] == 3
    with throttle.request("airline") as refused:  # places given back
        assert refused is None


def test_configure__refuses_what_it_cannot_play() -> None:
    with pytest.raises(ValueError, match="partner must be one of"):
        Throttle().configure({"bank": {"rate": 1}})
    with pytest.raises(ValueError, match="whole number"):
        Throttle().configure({"stripe": {"rate": 1.5}})


def test_partner_of__paths() -> None:
    assert partner_of("/v1/payment_intents") == "stripe"
    assert partner_of("/v1/chat/completions") == "llm"
    assert partner_of("/airline/bookings/X") == "airline"
    assert partner_of("/_sandbox/ledger") is None
