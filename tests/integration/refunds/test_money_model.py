"""The model-based test of the money paths (refunds.chaos.model) at the suite's budget, with a
fixed seed so that a failure replays. `manage.py chaos --model --seed 20261201 --examples N`
runs the same machine longer and shrinks what it finds to a minimal sequence of rules."""

from __future__ import annotations

import json

import pytest

from refunds.chaos.exploration import explore
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.django_db(transaction=True)]

#: About a minute here (0.8 s an example). Shrinking is left to `chaos --model`: it can take
#: minutes per failure, which the suite cannot spend.
EXAMPLES = 60
STEPS = 40
SEED = 20261201


@pytest.mark.xfail(
    strict=False,
    reason="issue 19 findings 1-3 and 5 (cancel and fork keep or double the fee; a stale "
    "model call recorded across a fork) are being fixed on money-cancel and money-claims, and "
    "issue 15's 'done' predicate (an agent run COMPLETED without the service) on agent-guard",
)
def test_money_model__no_sequence_of_rules_keeps_or_doubles_money(partners: SandboxProcess) -> None:
    figures = explore(
        sandbox_url=partners.url, examples=EXAMPLES, steps=STEPS, seed_value=SEED, shrink=False
    )
    print(json.dumps(figures, indent=2))
    assert figures["examples"] >= EXAMPLES and figures["invariant_checks"] > 0
    assert not figures["violations"], json.dumps(figures["violations"], indent=2)
