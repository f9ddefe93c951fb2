"""The rules of partner limits, pure (docs/partner-limits.md, "What happens"): the setting as
written, the partner's own words in its headers, the key's speed after a 429 or a closed breaker,
the breaker's cool-down."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from agentflow._base import rate_signals
from agentflow._limits import limiter, rules
from agentflow.exceptions import PartnerRateLimited


def test_parse_limits__rates_and_concurrency() -> None:
    parsed = rules.parse_limits(
        '{"stripe": {"rate": "25/s"}, "airline": {"concurrency": 3}, "llm": {"rate": "60/m"}}'
    )
    assert parsed["stripe"].rate_per_second == 25
    assert parsed["airline"].concurrency == 3 and parsed["airline"].rate_per_second is None
    assert parsed["llm"].rate_per_second == 1
    assert rules.parse_rate("1000/h") == pytest.approx(1000 / 3600)


def test_parse_limits__keys_as_real_systems_name_them() -> None:
    keys = ("openai/gpt-4o-mini", "crm:eu-west.1", "legacy airline", "zahlungsdienst/ü:naïve 東京")

    parsed = rules.parse_limits(json.dumps({key: {"concurrency": 1} for key in keys}))

    assert [parsed[key].partner for key in keys] == list(keys)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("{", "not JSON"),
        ('{"stripe": {"rate": "25 per second"}}', 'stripe: a rate is "N/s"'),
        ('{"stripe": {"rate": "0/s"}}', "above zero"),
        ('{"airline": {"concurrency": 0}}', "whole number from 1"),
        ('{"airline": {"burst": 3}}', "and/or"),
        ("[1]", "maps partner keys"),
        ('{"stripe\\n": {"rate": "1/s"}}', "partner key is 1-100 characters.*U\\+000A"),
        ('{" stripe": {"rate": "1/s"}}', "has a space at an end"),
        (json.dumps({"k" * 101: {"rate": "1/s"}}), "has 101"),
    ],
)
def test_parse_limits__says_what_is_wrong(value: str, says: str) -> None:
    with pytest.raises(rules.LimitsError, match=says):
        rules.parse_limits(value)


def test_rate_signals__stripe_openai_and_retry_after() -> None:
    stripe = rate_signals.read({"Stripe-Rate-Limited-Reason": "global-rate", "Retry-After": "2"})
    assert (stripe.reason, stripe.retry_after_seconds) == ("global-rate", 2.0)
    openai = rate_signals.read(
        {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s"}
    )
    assert openai.exhausted and openai.reset_seconds == 360.0
    assert rate_signals.read({"retry-after-ms": "250"}).retry_after_seconds == 0.25
    assert rate_signals.duration_seconds("1h2m3.5s") == 3723.5
    assert rate_signals.duration_seconds("soon") is None
    dated = rate_signals.read({"Retry-After": "Wed, 21 Oct 2015 07:28:10 GMT"}, now=1445412480.0)
    assert dated.retry_after_seconds == 10.0


def test_a_429__blocks_for_what_the_partner_said__capped() -> None:
    told = PartnerRateLimited.from_headers("429", {"Retry-After": "3"})
    assert rules.block_seconds(told) == 3.0
    assert rules.block_seconds(PartnerRateLimited("429")) == rules.DEFAULT_BLOCK_SECONDS
    with override_settings(AGENTFLOW_MAX_BACKOFF=10.0):
        assert rules.block_seconds(PartnerRateLimited("429", retry_after_seconds=1e9)) == 10.0


@override_settings(AGENTFLOW_PARTNER_RECOVERY_SECONDS=30.0)
def test_speed__halves_after_a_429__climbs_back_linearly() -> None:
    assert rules.slowed(1.0) == 0.5
    assert rules.slowed(0.15) == rules.FLOOR_FACTOR
    assert rules.speed(floor=0.5, since=100.0, now=100.0) == 0.5
    assert rules.speed(floor=0.5, since=100.0, now=115.0) == pytest.approx(0.75)
    assert rules.speed(floor=0.5, since=100.0, now=200.0) == 1.0
    stripe = rules.Limit(partner="stripe", rate_per_second=5.0)
    assert rules.interval_seconds(stripe, 1.0) == pytest.approx(0.2)
    assert rules.interval_seconds(stripe, 0.5) == pytest.approx(0.4)


@override_settings(AGENTFLOW_BREAKER_COOLDOWN_SECONDS=5.0, AGENTFLOW_BREAKER_FAILURES=5)
def test_breaker__trips_at_the_threshold__cooldown_doubles_to_a_minute() -> None:
    assert not rules.trips(4) and rules.trips(5)
    assert [rules.cooldown_seconds(n) for n in (1, 2, 3, 4, 5)] == [5, 10, 20, 40, 60]


@override_settings(AGENTFLOW_PARTNER_LIMITS={"llm": {"rate": "60/m"}}, AGENTFLOW_LLM_MODEL="m1")
def test_model_requests__count_against_llm__or_the_model_when_named() -> None:
    assert limiter.model_partner() == "llm"
    with override_settings(AGENTFLOW_PARTNER_LIMITS={"m1": {"rate": "1/s"}}):
        assert limiter.model_partner() == "m1"
    with override_settings(AGENTFLOW_PARTNER_LIMITS={}):
        assert limiter.model_partner() is None


@override_settings(AGENTFLOW_PARTNER_RECOVERY_SECONDS=30.0)
def test_speed__after_a_429_climbs_to_the_learned_ceiling__and_holds_there_a_while() -> None:
    """A key limited at twice what the partner allows must stop drawing 429s, not draw one each
    time it recovers: it climbs back to 90 % of where the 429 came, and stays there for ten
    recovery times before it tries higher."""
    ceiling = rules.ceiling_after(0.5)
    assert ceiling == pytest.approx(0.45)
    assert rules.speed(floor=0.25, since=0.0, now=60.0, ceiling=ceiling) == pytest.approx(0.45)
    assert rules.speed(floor=0.25, since=0.0, now=299.0, ceiling=ceiling) == pytest.approx(0.45)
    assert rules.speed(floor=0.25, since=0.0, now=315.0, ceiling=ceiling) > 0.45
    assert rules.speed(floor=0.25, since=0.0, now=400.0, ceiling=ceiling) == 1.0


def test_a_429__learns_what_the_partner_accepted_in_the_last_second() -> None:
    """A key set at 10/s against a partner that takes 5: 10 calls given in the last second,
    5 refused, so it accepted half the limit; the key slows to below that at once, and climbs
    back no higher (not to 90 % of the 10/s the 429 came at)."""
    stripe = rules.Limit(partner="stripe", rate_per_second=10.0)
    accepted = rules.accepted_share(stripe, given=10, refused=5, seconds=1.0)
    assert accepted == pytest.approx(0.5)
    assert rules.slowed(1.0, accepted) == pytest.approx(0.45)
    assert rules.ceiling_after(1.0, accepted) == pytest.approx(0.45)
    # Too few calls to tell, or no rate: only the speed the 429 came at counts.
    assert rules.accepted_share(stripe, given=2, refused=1, seconds=1.0) is None
    unrated = rules.Limit(partner="airline", concurrency=3)
    assert rules.accepted_share(unrated, given=10, refused=5, seconds=1.0) is None
    assert rules.slowed(1.0, None) == 0.5 and rules.ceiling_after(1.0, None) == 0.9
    assert rules.slowed(1.0, 0.0) == rules.FLOOR_FACTOR  # it accepted nothing: the floor
