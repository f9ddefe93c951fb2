"""A member of a batch of read-only calls (`agentflow.agent.steps`) is a read: what its failure
means is the read rule's, decided by `failures.classify` on the facts a read step's attempt
gives (docs/protocol.md, "What a failure means"). One row per error a member's tool may raise,
with the verdict the batch's fenced writes then record (no database here)."""

from __future__ import annotations

from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db import OperationalError

from agentflow._base.retry import RetryPolicy
from agentflow._base.states import StepKind
from agentflow._core.registry import StepDef
from agentflow._core.serialization import NotJSONError
from agentflow._engine import failures
from agentflow._engine.attempts import failure_facts
from agentflow._engine.failures import Fail, Park, Retry, Wait
from agentflow.agent.steps import member_verdict
from agentflow.exceptions import (
    NeedsAttention,
    PartnerWait,
    PermanentStepError,
    RetryableStepError,
)


def _lookup(ctx: Any) -> None:
    raise AssertionError("never run here")


#: A read-only tool call as a batch runs it: three attempts, its back-off the partner's asking.
MEMBER = StepDef(
    name="lookup_price",
    kind=StepKind.READ,
    fn=_lookup,
    retry=RetryPolicy(max_attempts=3, base_seconds=0.0, max_seconds=0.0),
)
DB = "server closed the connection"
DB_GAVE_UP = f"gave up after 3 attempts: {DB}"

ROWS: list[tuple[str, int, BaseException, failures.Verdict]] = [
    (
        # Once failed the run as "unexpected NeedsAttention"; a read asks for a person.
        "asks for a person: the run parks with its reason",
        1,
        NeedsAttention("the till and the shelf disagree"),
        Park(
            reason="lookup_price: the till and the shelf disagree",
            error="the till and the shelf disagree",
        ),
    ),
    (
        "no turn at the partner: waits, no attempt spent",
        1,
        PartnerWait("lookups", "rate limit", 5.0),
        Wait(partner="lookups", why="waiting for lookups: rate limit", seconds=5.0),
    ),
    (
        "no turn at the partner on its last attempt: still waits, as a read does",
        3,
        PartnerWait("lookups", "rate limit", 5.0),
        Wait(partner="lookups", why="waiting for lookups: rate limit", seconds=5.0),
    ),
    (
        # Once re-raised, its traceback logged unmasked; a read's attempt is retried.
        "database trouble: retried under the same key",
        1,
        OperationalError(DB),
        Retry(error=DB, delay_seconds=0.0),
    ),
    (
        "database trouble to the bound: parks, never fails",
        3,
        OperationalError(DB),
        Park(
            reason=f"lookup_price: the database kept failing ({DB_GAVE_UP}); retry once it is back",
            error=DB_GAVE_UP,
        ),
    ),
    (
        "transient: retried after the partner's Retry-After",
        1,
        RetryableStepError("502", retry_after_seconds=4.0),
        Retry(error="502", delay_seconds=4.0),
    ),
    (
        "a soft time limit: retried, said by its type",
        2,
        SoftTimeLimitExceeded(),
        Retry(error="SoftTimeLimitExceeded()", delay_seconds=0.0),
    ),
    (
        "transient to the bound: fails",
        3,
        RetryableStepError("502"),
        Fail(error="gave up after 3 attempts: 502"),
    ),
    ("refused: fails", 1, PermanentStepError("no such product"), Fail(error="no such product")),
    ("result not JSON: fails", 1, NotJSONError("not JSON"), Fail(error="not JSON")),
    (
        "a bug: fails readably, traceback logged (masked)",
        1,
        KeyError("price"),
        Fail(error="unexpected KeyError: 'price'", log_traceback=True),
    ),
]


@pytest.mark.parametrize(
    ("attempt", "error", "verdict"), [row[1:] for row in ROWS], ids=[row[0] for row in ROWS]
)
def test_a_members_failure__is_the_read_rules_verdict(
    attempt: int, error: BaseException, verdict: failures.Verdict
) -> None:
    assert member_verdict(MEMBER, attempt, error) == verdict
    assert verdict == failures.classify(failure_facts(MEMBER, attempt, error))  # the one place


def test_the_table__covers_every_verdict_a_read_can_have() -> None:
    assert {type(row[3]) for row in ROWS} == {Retry, Wait, Park, Fail}
