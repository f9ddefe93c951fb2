"""Around each partner call (docs/partner-limits.md, "What happens"): every gateway reaches it
through `durable.partner_call`, and so do model requests (partner `llm`).

A call to a partner named in AGENTFLOW_PARTNER_LIMITS takes a turn from the store
(`agentflow._limits.store`, by `agentflow._limits.rules`) before it goes and gives it back after,
with what the partner said. A step that gets no turn raises `PartnerWait`: the runtime records
the step waiting (no worker held, no attempt spent) and publishes it again when its turn comes.
A partner nobody named costs nothing here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from django.db import DatabaseError

from agentflow import _store as store
from agentflow._conf import settings
from agentflow._limits import rules
from agentflow._limits import store as rows
from agentflow._observe import telemetry
from agentflow.exceptions import (
    PartnerRateLimited,
    PartnerUnavailable,
    PartnerWait,
    RetryableStepError,
)

logger = logging.getLogger("agentflow.limiter")  # the name hosts' LOGGING knows

#: A call made outside any step (a view, a shell) cannot wait as a run: it sleeps for its turn,
#: at most this long in all, then gives up as a retryable error.
OUTSIDE_STEP_PATIENCE_SECONDS = 30.0

_step: ContextVar[tuple[str, int] | None] = ContextVar("agentflow_limited_step", default=None)
#: The step's calls to a limited partner that went and failed (a 429 is an answer, not one).
_failed: ContextVar[list[str] | None] = ContextVar("agentflow_failed_calls", default=None)


@contextmanager
def step_calls(run_id: str, seq: int) -> Iterator[None]:
    """Calls made meanwhile are step `seq` of `run_id`'s: a call that must wait makes the step
    wait, in its place in the partner's queue."""
    token, failed = _step.set((run_id, seq)), _failed.set([])
    try:
        yield
    finally:
        _failed.reset(failed)
        _step.reset(token)


def failed_calls() -> int:
    """How many of this step's calls to a limited partner went and failed (anything but a
    429): a wait after one is no free wait, the attempt was spent
    (docs/protocol.md, "Unknown outcomes")."""
    return len(_failed.get() or ())


@contextmanager
def partner_call(partner: str, operation: str) -> Iterator[None]:
    """Around one request to `partner`: its turn first (or PartnerWait), then the request,
    traced and counted, then the turn back with what the partner said."""
    limit = rules.limit_for(partner)
    if limit is None:
        with telemetry.partner_call(partner, operation):
            yield
        return
    turn = _take(limit)
    if turn.sleep_seconds > 0:
        time.sleep(turn.sleep_seconds)
    outcome, detail, block, reason = rows.NEUTRAL, "", 0.0, ""
    try:
        with telemetry.partner_call(partner, operation):
            yield
        outcome = rows.OK
    except PartnerRateLimited as exc:
        # An answer: the partner did not act. The key slows for every run, and this step waits
        # for its next turn instead of spending an attempt (or being taken for an unknown).
        outcome, detail, reason = rows.RATE_LIMITED, f"{operation}: {exc}", exc.reason
        block = rules.block_seconds(exc)
        raise PartnerWait(partner, "rate limited by the partner", block) from exc
    except PartnerUnavailable as exc:
        outcome, detail = rows.UNAVAILABLE, f"{operation}: {exc}"
        _failed_call(operation)
        raise
    except PartnerWait:
        raise
    except Exception:
        _failed_call(operation)
        raise
    finally:
        _give_back(limit, turn, outcome, detail, block, reason)


def _failed_call(operation: str) -> None:
    failed = _failed.get()
    if failed is not None:
        failed.append(operation)


def model_partner() -> str | None:
    """The partner key model requests count against: the model's own name when
    AGENTFLOW_PARTNER_LIMITS names it, else `llm` when it names that; None when neither is
    limited (a model request is then traced as before, not as a partner call)."""
    model = str(settings.AGENTFLOW_LLM_MODEL or "")
    for key in (model, "llm"):
        if key and rules.limit_for(key) is not None:
            return key
    return None


def _take(limit: rules.Limit) -> rows.Turn:
    step = _step.get()
    if step is not None:
        decided = rows.turn_take(limit, run_id=step[0], seq=step[1])
        if isinstance(decided, rows.TurnWait):
            raise PartnerWait(limit.partner, decided.reason, decided.seconds)
        return decided
    deadline = time.monotonic() + OUTSIDE_STEP_PATIENCE_SECONDS
    while True:
        decided = rows.turn_take(limit)
        if not isinstance(decided, rows.TurnWait):
            return decided
        left = deadline - time.monotonic()
        if left <= 0:
            raise RetryableStepError(f"waiting for {limit.partner}: {decided.reason}")
        time.sleep(min(decided.seconds, left, 1.0))


def _give_back(
    limit: rules.Limit, turn: rows.Turn, outcome: str, detail: str, block: float, reason: str
) -> None:
    """A database that fails here costs the place its lease, never the call's result. What the
    partner said is kept on the Partners page, which anyone who may see partners reads: a
    value of the run's sensitive arguments it repeats is masked, as in a log line."""
    step = _step.get()
    try:
        if detail and step is not None:
            detail = store.masked(step[0], detail)
        rows.turn_return(
            limit, turn, outcome=outcome, detail=detail, block_seconds=block, rate_reason=reason
        )
    except DatabaseError:
        logger.warning(
            "%s: could not give the turn back (its lease frees it)", limit.partner, exc_info=True
        )
