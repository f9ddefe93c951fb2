"""The model-based test of the money paths (refunds.chaos.model) at the suite's budget, with a
fixed seed so that a failure replays. `manage.py chaos --model --seed 20261201 --examples N`
runs the same machine longer and shrinks what it finds to a minimal sequence of rules."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.management import call_command

from refunds.chaos.exploration import explore, replay
from tests.support.sandbox import SandboxProcess

pytestmark = [pytest.mark.django_db(transaction=True)]

#: About a minute on this shared machine (0.7 to 2 s an example, as busy as it is). Shrinking
#: is left to `chaos --model`: it can take minutes per failure, which the suite cannot spend.
EXAMPLES = 40
STEPS = 40
SEED = 20261201


def test_money_model__no_sequence_of_rules_keeps_or_doubles_money(partners: SandboxProcess) -> None:
    figures = explore(
        sandbox_url=partners.url, examples=EXAMPLES, steps=STEPS, seed_value=SEED, shrink=False
    )
    print(json.dumps(figures, indent=2))
    assert figures["examples"] >= EXAMPLES and figures["invariant_checks"] > 0
    assert figures["rules"].get("deploy", 0) > 0  # builds changed under runs in flight (I8 after)
    assert not figures["violations"], json.dumps(figures["violations"], indent=2)


#: Minimal sequences the machine broke an invariant with on the code before the issue 19
#: fixes (one per finding it reaches); each fails with its fix reverted, and holds with it.
FOUND = {
    "finding 1: cancel while the charge's outcome is unknown keeps the fee": [
        ("first", {"engine": "graph", "declining": False}),
        ("next_charge", {"outcome": "lost"}),
        ("work", {"deliveries": 12}),
        ("operator", {"action": "cancel", "run": 0}),
        ("work", {"deliveries": 12}),
    ],
    "finding 2: a fork over a charge whose outcome is unknown charges twice": [
        ("first", {"engine": "agent", "declining": False}),
        ("next_charge", {"outcome": "lost"}),
        ("work", {"deliveries": 12}),
        ("model_redeployed", {}),
        ("time_passes", {"seconds": 301.0}),
        ("sweep", {}),
        ("work", {"deliveries": 12}),
        ("fork", {"run": 0, "position": 2}),
        ("work", {"deliveries": 12}),
        ("work", {"deliveries": 12}),
    ],
    "finding 3: undoing a set-aside charge after a fork refunds nothing": [
        ("first", {"engine": "agent", "declining": False}),
        ("next_partner_call", {"endpoint": "airline.boarding_pass", "outcome": "5xx"}),
        ("work", {"deliveries": 12}),
        ("model_redeployed", {}),
        ("time_passes", {"seconds": 301.0}),
        ("sweep", {}),
        ("work", {"deliveries": 12}),
        ("fork", {"run": 0, "position": 2}),
        ("operator", {"action": "cancel", "run": 0}),
        ("work", {"deliveries": 12}),
    ],
    "a declined card told, then a fork completes the change: one confirmation, one notice": [
        ("first", {"engine": "agent", "declining": False}),
        ("next_charge", {"outcome": "declined"}),
        ("work", {"deliveries": 10}),
        ("fork", {"run": 0, "position": 1}),
    ],
    "finding 5: a stale model call is recorded across a fork (fences restart)": [
        ("first", {"engine": "agent", "declining": False}),
        ("work", {"deliveries": 1}),
        ("deliver_and_pause", {"index": 0, "worker": 0, "point": "after_effect"}),
        ("model_redeployed", {}),
        ("time_passes", {"seconds": 3601.0}),
        ("sweep", {}),
        ("work", {"deliveries": 1}),
        ("fork", {"run": 0, "position": 2}),
        ("deliver_and_crash", {"index": 0, "worker": 0, "point": "after_claim"}),
        ("wake_paused", {}),
    ],
}


@pytest.mark.parametrize("rules", FOUND.values(), ids=FOUND.keys())
def test_money_model__sequences_it_found_hold(
    partners: SandboxProcess, rules: list[tuple[str, dict[str, Any]]]
) -> None:
    replay(sandbox_url=partners.url, rules=rules)


def test_chaos_model__prints_its_figures_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`chaos --model` starts its own sandbox, explores, and says what it did and found."""
    call_command("chaos", "--model", "--examples", "2", "--steps", "6", "--seed", "7")
    report = json.loads(capsys.readouterr().out)
    assert report["seed"] == 7 and report["steps_per_example"] == 6
    assert report["examples"] >= 2 and report["invariant_checks"] >= report["rules_applied"] > 0
    assert report["violations"] == []


#: Fee waivers in the machine's own rules: approve, reject, the approval's timeout, two
#: approvers, a cancel while it waits, and a crash right after the decision; every one must
#: end with no money kept without the service (an approved waiver keeps no fee at all).
WAIVERS = {
    # chaos --model found it: a waiting run's countdown, delivered early, rang again for ever.
    "nobody decides: the end times it out": [
        ("first", {"engine": "graph", "declining": False, "waiver": True}),
    ],
    "approved, then the pass refused": [
        ("first", {"engine": "graph", "declining": False, "waiver": True}),
        ("work", {"deliveries": 12}),
        ("decide", {"run": 0, "approved": True, "approver": "ann"}),
        ("decide", {"run": 0, "approved": False, "approver": "bob"}),
        ("next_partner_call", {"endpoint": "airline.boarding_pass", "outcome": "declined"}),
        ("work", {"deliveries": 12}),
        ("work", {"deliveries": 12}),
    ],
    "rejected, the charge's answer lost, then a crash": [
        ("first", {"engine": "agent", "declining": False, "waiver": True}),
        ("work", {"deliveries": 12}),
        ("decide", {"run": 0, "approved": False, "approver": "ann"}),
        ("next_charge", {"outcome": "lost"}),
        ("deliver_and_crash", {"index": 0, "worker": 0, "point": "after_claim"}),
        ("work", {"deliveries": 12}),
        ("work", {"deliveries": 12}),
    ],
    "timed out, then a late approval, then cancelled": [
        ("first", {"engine": "graph", "declining": False, "waiver": True}),
        ("work", {"deliveries": 12}),
        ("approval_times_out", {"run": 0}),
        ("decide", {"run": 0, "approved": True, "approver": "ann"}),
        ("sweep", {}),
        ("work", {"deliveries": 12}),
        ("operator", {"action": "cancel", "run": 0}),
        ("work", {"deliveries": 12}),
    ],
    "cancelled while it waits, both engines": [
        ("first", {"engine": "agent", "declining": False, "waiver": True}),
        ("start", {"engine": "graph", "declining": True, "waiver": True}),
        ("work", {"deliveries": 12}),
        ("work", {"deliveries": 12}),
        ("operator", {"action": "cancel", "run": 0}),
        ("decide", {"run": 0, "approved": True, "approver": "ann"}),
        ("decide", {"run": 1, "approved": False, "approver": "bob"}),
        ("work", {"deliveries": 12}),
        ("work", {"deliveries": 12}),
    ],
}


@pytest.mark.parametrize("rules", WAIVERS.values(), ids=WAIVERS.keys())
def test_money_model__fee_waiver_sequences_hold(
    partners: SandboxProcess, rules: list[tuple[str, dict[str, Any]]]
) -> None:
    replay(sandbox_url=partners.url, rules=rules)
