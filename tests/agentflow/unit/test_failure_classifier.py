"""What a step's failure means (`agentflow._engine.failures`): one row per case, every verdict
and every cause, with the exact reasons the run and its events show (no database here)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db import IntegrityError, OperationalError

from agentflow._core.serialization import NotJSONError
from agentflow._engine import failures
from agentflow._engine.failures import (
    Ask,
    Cause,
    Fail,
    Failure,
    Moment,
    Park,
    Proceed,
    Retry,
    Wait,
    classify,
)
from agentflow.exceptions import (
    AnswerLost,
    BudgetExceeded,
    NeedsAttention,
    OutcomeUnknown,
    PartnerRateLimited,
    PartnerWait,
    PermanentStepError,
    RepeatUnsafe,
    RetryableStepError,
)
from agentflow.models import RunEvent

NA, UNKNOWN = RunEvent.Kind.NEEDS_ATTENTION, RunEvent.Kind.OUTCOME_UNKNOWN
TAIL = ". Retry asks the partner first and never repeats it blindly."


def facts(cause: Cause, kind: str = "effect", **more: Any) -> Failure:
    """`charge`'s first of three attempts, with a reconcile, failing with `cause`."""
    base: dict[str, Any] = {
        "cause": cause,
        "step": "charge",
        "kind": kind,
        "detail": "timeout",
        "error_type": "RetryableStepError",
        "attempt": 1,
        "max_attempts": 3,
        "reconcile": True,
        "backoff_seconds": 2.0,
    }
    return Failure(**{**base, **more})


def last(failure: Failure) -> Failure:
    return replace(failure, attempt=failure.max_attempts)


def unknown(reason: str, **more: Any) -> Park:
    return Park(
        reason=f"outcome unknown: charge may or may not have taken effect: {reason}{TAIL}",
        kind=UNKNOWN,
        error=reason,
        **more,
    )


WAIT = {"partner": "stripe", "detail": "stripe: rate limited", "wait_seconds": 5.0}
ASKED = Ask(reason="timeout", retry_in_seconds=2.0)
GAVE_UP = "gave up after 3 attempts: timeout"
BUG = {"cause": Cause.BUG, "detail": "'amount'", "error_type": "KeyError"}
DB_GAVE_UP = "gave up after 3 attempts: server closed the connection"
DB = {"detail": "server closed the connection", "error_type": "OperationalError"}
WINDOW = "its first attempt is older than the partner's idempotency window (86400 s)"
TOO_OLD = {"moment": Moment.TAKEOVER, "window_seconds": 86400.0, "too_old": True}
INSIDE = {"moment": Moment.TAKEOVER, "window_seconds": 86400.0, "too_old": False}
WHY = "deciding what it waits for raised ValueError: bad predicate"
WAIT_RULE_UNSETTLED = (
    f"outcome unknown: charge may have taken effect, and {WHY}; fix that, then retry (it asks "
    "the partner first)"
)
UNRECORDABLE = (
    "charge ran but its result cannot be recorded (not JSON); check the partner before retrying"
)
KEPT_DYING = (
    "outcome unknown: charge was attempted 3 times without finishing (the worker kept dying); "
    "check the partner, then retry (it asks the partner first)"
)
CANCELLED = "the run was cancelled and the partner could not say whether it happened"

ROWS: list[tuple[str, Failure, failures.Verdict]] = [
    # --- the attempt raised: what every kind of step does with it -------------------------------
    ("read refused fails", facts(Cause.PERMANENT, "read"), Fail(error="timeout")),
    ("effect refused fails: nothing happened", facts(Cause.PERMANENT), Fail(error="timeout")),
    ("llm refused fails", facts(Cause.PERMANENT, "llm"), Fail(error="timeout")),
    ("db refused fails", facts(Cause.PERMANENT, "db"), Fail(error="timeout")),
    (
        "read transient retries",
        facts(Cause.TRANSIENT, "read"),
        Retry(error="timeout", delay_seconds=2.0),
    ),
    (
        "read transient without text says its type",
        facts(Cause.TRANSIENT, "read", detail=""),
        Retry(error="RetryableStepError", delay_seconds=2.0),
    ),
    (
        "read transient on its last attempt fails",
        last(facts(Cause.TRANSIENT, "read")),
        Fail(error=GAVE_UP),
    ),
    ("effect transient retries", facts(Cause.TRANSIENT), Retry(error="timeout", delay_seconds=2.0)),
    (
        "effect transient on its last attempt asks the partner",
        last(facts(Cause.TRANSIENT)),
        Ask(reason=GAVE_UP),
    ),
    (
        "effect without reconcile on its last attempt parks unknown",
        last(facts(Cause.TRANSIENT, reconcile=False)),
        unknown(GAVE_UP),
    ),
    (
        "llm transient on its last attempt fails: it changed nothing outside",
        last(facts(Cause.TRANSIENT, "llm")),
        Fail(error=GAVE_UP),
    ),
    (
        "read database trouble retries",
        facts(Cause.DATABASE, "read", **DB),
        Retry(error=DB["detail"], delay_seconds=2.0),
    ),
    (
        "read database trouble at the bound parks, never fails",
        last(facts(Cause.DATABASE, "read", **DB)),
        Park(
            reason=f"charge: the database kept failing ({DB_GAVE_UP}); retry once it is back",
            error=DB_GAVE_UP,
        ),
    ),
    (
        "llm database trouble at the bound parks",
        last(facts(Cause.DATABASE, "llm", **DB)),
        Park(
            reason=f"charge: the database kept failing ({DB_GAVE_UP}); retry once it is back",
            error=DB_GAVE_UP,
        ),
    ),
    (
        "effect database trouble at the bound parks unknown, no reconcile asked",
        last(facts(Cause.DATABASE, **DB)),
        unknown(f"the database kept failing ({DB_GAVE_UP})"),
    ),
    (
        "effect answer lost asks first, then retries",
        facts(Cause.ANSWER_LOST),
        Ask(reason="timeout", retry_in_seconds=2.0),
    ),
    (
        "effect answer lost on its last attempt asks, then fails",
        last(facts(Cause.ANSWER_LOST)),
        Ask(reason="timeout"),
    ),
    (
        "effect answer lost without reconcile retries under its key",
        facts(Cause.ANSWER_LOST, reconcile=False),
        Retry(error="timeout", delay_seconds=2.0),
    ),
    (
        "effect answer lost without reconcile at the bound parks unknown",
        last(facts(Cause.ANSWER_LOST, reconcile=False)),
        unknown(GAVE_UP),
    ),
    (
        "llm answer lost retries",
        facts(Cause.ANSWER_LOST, "llm"),
        Retry(error="timeout", delay_seconds=2.0),
    ),
    (
        "read bug fails readably, traceback logged",
        facts(**BUG, kind="read"),
        Fail(error="unexpected KeyError: 'amount'", log_traceback=True),
    ),
    (
        "llm bug fails",
        facts(**BUG, kind="llm"),
        Fail(error="unexpected KeyError: 'amount'", log_traceback=True),
    ),
    (
        "effect bug asks the partner",
        facts(**BUG),
        Ask(reason="unexpected KeyError: 'amount'", log_traceback=True),
    ),
    (
        "effect bug without reconcile parks unknown",
        facts(**BUG, reconcile=False),
        unknown("unexpected KeyError: 'amount'", log_traceback=True),
    ),
    (
        "a step raising OutcomeUnknown is a bug",
        facts(Cause.OUTCOME_UNKNOWN, "read", error_type="OutcomeUnknown"),
        Fail(error="unexpected OutcomeUnknown: timeout", log_traceback=True),
    ),
    (
        "a step raising RepeatUnsafe is a bug",
        facts(Cause.REPEAT_UNSAFE, "llm", error_type="RepeatUnsafe"),
        Fail(error="unexpected RepeatUnsafe: timeout", log_traceback=True),
    ),
    (
        "read asks for a person",
        facts(Cause.NEEDS_ATTENTION, "read", detail="totals differ"),
        Park(reason="charge: totals differ", error="totals differ"),
    ),
    (
        "effect asks for a person",
        facts(Cause.NEEDS_ATTENTION, detail="totals differ"),
        Park(reason="charge: totals differ", error="totals differ"),
    ),
    (
        "read result not JSON fails",
        facts(Cause.NOT_JSON, "read", detail="not JSON"),
        Fail(error="not JSON"),
    ),
    (
        "effect result not JSON parks: it ran",
        facts(Cause.NOT_JSON, detail="not JSON"),
        Park(
            reason=UNRECORDABLE,
            error="not JSON",
        ),
    ),
    (
        "llm result not JSON parks",
        facts(Cause.NOT_JSON, "llm", detail="not JSON"),
        Park(
            reason=UNRECORDABLE,
            error="not JSON",
        ),
    ),
    (
        "read waits its turn, even spent at the bound",
        last(facts(Cause.PARTNER_WAIT, "read", spent=True, **WAIT)),
        Wait(partner="stripe", why="stripe: rate limited", seconds=5.0),
    ),
    (
        "effect waits its turn",
        facts(Cause.PARTNER_WAIT, **WAIT),
        Wait(partner="stripe", why="stripe: rate limited", seconds=5.0),
    ),
    (
        "effect spent before its bound waits",
        facts(Cause.PARTNER_WAIT, spent=True, **WAIT),
        Wait(partner="stripe", why="stripe: rate limited", seconds=5.0),
    ),
    (
        "effect not spent at its bound waits: a free wait",
        last(facts(Cause.PARTNER_WAIT, **WAIT)),
        Wait(partner="stripe", why="stripe: rate limited", seconds=5.0),
    ),
    (
        "effect spent at its bound parks unknown, asks no more",
        last(facts(Cause.PARTNER_WAIT, spent=True, **WAIT)),
        unknown("gave up after 3 attempts: stripe: rate limited"),
    ),
    (
        "llm spent at its bound fails",
        last(facts(Cause.PARTNER_WAIT, "llm", spent=True, **WAIT)),
        Fail(error="gave up after 3 attempts: stripe: rate limited"),
    ),
    (
        "read's worker died, below the bound: runs again",
        facts(Cause.WORKER_LOST, "read", attempt=2),
        Proceed(),
    ),
    (
        "read killed its worker at the bound: parks",
        last(facts(Cause.WORKER_LOST, "read")),
        Park(reason="charge killed its worker 3 times"),
    ),
    (
        "effect's worker died, below the bound: claimed again",
        facts(Cause.WORKER_LOST, attempt=2),
        Proceed(),
    ),
    (
        "effect killed its worker at the bound: parks unknown",
        last(facts(Cause.WORKER_LOST)),
        Park(
            reason=KEPT_DYING,
            kind=UNKNOWN,
            error="worker kept dying",
        ),
    ),
    (
        "a wait rule raising fails the run",
        facts(Cause.WAIT_RULE, "read", detail="bad predicate", error_type="ValueError"),
        Fail(error=WHY, log_traceback=True),
    ),
    (
        "a wait rule raising before an unsettled effect parks",
        facts(
            Cause.WAIT_RULE, "read", detail="bad predicate", error_type="ValueError", unsettled=True
        ),
        Park(
            reason=WAIT_RULE_UNSETTLED,
            kind=UNKNOWN,
            log_traceback=True,
        ),
    ),
    # --- a takeover's reconcile, before running again ----------------------------------------
    (
        "takeover without reconcile inside the window relies on the key",
        facts(Cause.UNASKED, **INSIDE),
        Proceed(),
    ),
    (
        "takeover without reconcile past the window parks unknown",
        facts(Cause.UNASKED, **TOO_OLD),
        unknown(f"{WINDOW} and there is no way to ask the partner what happened"),
    ),
    ("takeover proven absent calls again", facts(Cause.ABSENT, **TOO_OLD), Proceed()),
    (
        "takeover whose reconcile failed inside the window calls under the key",
        facts(Cause.TRANSIENT, **INSIDE),
        Proceed(),
    ),
    (
        "takeover whose reconcile failed past the window parks unknown",
        facts(Cause.TRANSIENT, **TOO_OLD),
        unknown(f"{WINDOW} and the partner could not say whether it happened (timeout)"),
    ),
    (
        "takeover with a repeat unsafe parks unknown",
        facts(Cause.REPEAT_UNSAFE, detail="no key", **INSIDE),
        unknown("no key"),
    ),
    (
        "takeover without a turn waits",
        facts(Cause.PARTNER_WAIT, **INSIDE, **WAIT),
        Wait(partner="stripe", why="stripe: rate limited", seconds=5.0),
    ),
    # --- asking after this attempt's call may have happened -----------------------------------
    (
        "proven absent after an answer lost retries",
        facts(Cause.ABSENT, moment=Moment.ASK, asked=ASKED),
        Retry(error="timeout (the partner confirms it did not happen)", delay_seconds=2.0),
    ),
    (
        "proven absent with no retry left fails",
        facts(Cause.ABSENT, moment=Moment.ASK, asked=Ask(reason=GAVE_UP)),
        Fail(error=f"{GAVE_UP} (the partner confirms it did not happen)"),
    ),
    (
        "asking a repeat unsafe parks unknown",
        facts(Cause.REPEAT_UNSAFE, moment=Moment.ASK, asked=ASKED, detail="no key"),
        unknown("timeout; no key"),
    ),
    (
        "asking without a turn waits, and asks first next time",
        facts(Cause.PARTNER_WAIT, moment=Moment.ASK, asked=ASKED, **WAIT),
        Wait(partner="stripe", why="stripe: rate limited", seconds=5.0, unknown=True),
    ),
    (
        "asking spent at the bound parks unknown",
        last(facts(Cause.PARTNER_WAIT, moment=Moment.ASK, asked=ASKED, spent=True, **WAIT)),
        unknown("timeout; the partner could not say whether it happened (stripe: rate limited)"),
    ),
    (
        "asking that fails parks unknown",
        facts(Cause.TRANSIENT, moment=Moment.ASK, asked=ASKED, detail="502"),
        unknown("timeout; the partner could not say whether it happened (502)"),
    ),
    (
        "what was found cannot be recorded: parks unknown",
        facts(Cause.NOT_JSON, moment=Moment.ADOPT, detail="not JSON"),
        unknown("the partner has it but it cannot be recorded (not JSON)"),
    ),
    # --- a cancel that must know first ---------------------------------------------------------
    (
        "cancel without reconcile parks unknown",
        facts(Cause.UNASKED, moment=Moment.SETTLE),
        unknown("the run was cancelled and there is no way to ask the partner"),
    ),
    (
        "cancel proven absent fails: nothing to undo",
        facts(Cause.ABSENT, moment=Moment.SETTLE),
        Fail(error="cancelled before it took effect (the partner confirms it did not happen)"),
    ),
    (
        "cancel asking fails transiently: asks again later",
        facts(Cause.TRANSIENT, moment=Moment.SETTLE),
        Retry(error="cancelled; asking whether it took effect: timeout", delay_seconds=2.0),
    ),
    (
        "cancel asked, the partner cannot tell yet: asks again later",
        facts(Cause.OUTCOME_UNKNOWN, moment=Moment.SETTLE),
        Retry(error="cancelled; asking whether it took effect: timeout", delay_seconds=2.0),
    ),
    (
        "cancel asking on its last attempt parks unknown",
        last(facts(Cause.TRANSIENT, moment=Moment.SETTLE)),
        unknown(f"{CANCELLED} (timeout)"),
    ),
    (
        "cancel whose reconcile has a bug parks unknown",
        facts(**BUG, moment=Moment.SETTLE),
        unknown(f"{CANCELLED} ('amount')"),
    ),
    (
        "cancel asking without a turn waits",
        facts(Cause.PARTNER_WAIT, moment=Moment.SETTLE, **WAIT),
        Wait(partner="stripe", why="stripe: rate limited", seconds=5.0),
    ),
]


@pytest.mark.parametrize(
    ("failure", "verdict"), [row[1:] for row in ROWS], ids=[r[0] for r in ROWS]
)
def test_classify(failure: Failure, verdict: failures.Verdict) -> None:
    assert classify(failure) == verdict


def test_table__covers_every_cause_moment_and_verdict() -> None:
    assert {row[1].cause for row in ROWS} == set(Cause)
    assert {row[1].moment for row in ROWS} == set(Moment)
    assert {type(row[2]) for row in ROWS} == {Retry, Wait, Ask, Park, Fail, Proceed}


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (PermanentStepError("refused"), Cause.PERMANENT),
        (BudgetExceeded("over", limit="turns", used=3, allowed=2), Cause.PERMANENT),
        (RetryableStepError("502"), Cause.TRANSIENT),
        (PartnerRateLimited("slow down"), Cause.TRANSIENT),
        (SoftTimeLimitExceeded(), Cause.TRANSIENT),
        (AnswerLost("read timed out"), Cause.ANSWER_LOST),
        (OperationalError("server closed the connection"), Cause.DATABASE),
        (PartnerWait("stripe", "rate limited", 5.0), Cause.PARTNER_WAIT),
        (NeedsAttention("totals differ"), Cause.NEEDS_ATTENTION),
        (NotJSONError("not JSON"), Cause.NOT_JSON),
        (RepeatUnsafe("no key"), Cause.REPEAT_UNSAFE),
        (OutcomeUnknown("cannot tell"), Cause.OUTCOME_UNKNOWN),
        (IntegrityError("duplicate key"), Cause.BUG),  # a constraint is the code's, not the db's
        (KeyError("amount"), Cause.BUG),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_cause_of(error: BaseException, cause: Cause) -> None:
    assert failures.cause_of(error) is cause
