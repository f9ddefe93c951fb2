"""The model-based test of the money paths (refunds.chaos.model) at the suite's budget: a
fixed seed, so a failure replays; `manage.py chaos --model --examples N` runs it longer."""

from __future__ import annotations

import json

import pytest

from refunds.chaos.exploration import explore
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.django_db(transaction=True)]

#: Keeps this test to about a minute on the shared CI machine.
EXAMPLES = 30
STEPS = 40


def test_money_model__no_sequence_of_rules_keeps_or_doubles_money(partners: SandboxProcess) -> None:
    figures = explore(sandbox_url=partners.url, examples=EXAMPLES, steps=STEPS, seed_value=20261201)
    print(json.dumps(figures, indent=2))
    assert not figures["violations"], json.dumps(figures["violations"], indent=2)
