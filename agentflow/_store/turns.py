"""A step that waits for its turn at a partner (docs/partner-limits.md, "What happens"): its
checkpoint and its run, written so that a wait spends no attempt, holds no worker and never turns
"may have happened" into "did not happen" (docs/protocol.md, "Unknown outcomes").
"""

from __future__ import annotations

import logging

from django.db import transaction

from agentflow._base.states import RunStatus, StepStatus
from agentflow._core import builds, dispatch
from agentflow._store import sql
from agentflow._store.events import event_add
from agentflow._store.partners import CONCURRENCY, PARTNERS, WAITERS, epoch_now
from agentflow._store.runs import Fenced
from agentflow._store.steps import ACTIVE, CheckpointRow, Claim
from agentflow.models import RunEvent

logger = logging.getLogger("agentflow.store.turns")  # the name hosts' LOGGING knows

#: The kind of routing hold a partner wait is (`agentflow._builds.routing`): `partner:<key>`.
PARTNER_HOLD = "partner"

_RUN_AT_STEP = f"id = %s AND current_seq = %s AND status IN ({sql.placeholders(ACTIVE)})"


def step_wait_turn(
    run_id: str,
    seq: int,
    *,
    partner: str,
    why: str,
    seconds: float,
    claim: Claim | None = None,
    seen: CheckpointRow | None = None,
    unknown: bool = False,
    spent: bool = False,
) -> bool:
    """The step at `seq` waits `seconds` for its turn at `partner` (`why`: "waiting for stripe:
    rate limit"); the run is WAITING. Returns False when fenced out.

    `claim`: an effect or llm step's claim. Its attempt is given back (a wait is not an
    attempt). A takeover's checkpoint (`outcome_unknown`: a lost owner's call may have
    happened) stays IN_PROGRESS with its lease released, so the next claim asks the partner
    again before anything (so does one whose call may have happened and whose reconcile was
    refused its turn: `unknown`); any other becomes retryable FAILED, which "may have happened" as
    well. `spent`: a call of this attempt went and failed, so the attempt counts (its bound
    still parks a partner that keeps failing, docs/protocol.md, "Unknown outcomes"). Without a claim
    (a read step) only the run and any earlier failed checkpoint move.

    The run is held as routing holds it (`partner:<key>`, docs/deploys.md, "Builds"): one wait path
    and one reason surface for a build's worker and a partner's turn. A held event says why the
    first time it waits for this partner at this step, or when the reason changed; its message (a
    countdown) goes to where the run belongs (`builds.route`), as every release of a hold does.
    """
    seconds = max(float(seconds), 0.0)
    released = {
        "lease_owner": "",
        "lease_lock": None,
        "error": why[:4000],
    }
    try:
        with transaction.atomic():
            if claim is not None:
                if claim.outcome_unknown or unknown:
                    changes = {
                        **released,
                        "lease_expires_at": sql.at_now(),
                        "fence": claim.fence + 1,
                    }
                else:
                    changes = {
                        **released,
                        "status": StepStatus.FAILED,
                        "retryable": True,
                        "retry_at": None,
                        "lease_expires_at": None,
                        "finished_at": sql.at_now(),
                        "fence": claim.fence + 1,
                    }
                if not spent:
                    changes["attempts"] = sql.Expr("attempts - 1", ())
                if not sql.update(
                    sql.STEPS,
                    changes,
                    "run_id = %s AND seq = %s AND status = %s AND fence = %s",
                    [run_id, seq, StepStatus.IN_PROGRESS, claim.fence],
                ):
                    return False
            elif seen is not None and seen.status == StepStatus.FAILED:
                sql.update(
                    sql.STEPS,
                    {"retry_at": None, "error": why[:4000]},
                    "run_id = %s AND seq = %s AND fence = %s AND status = %s",
                    [run_id, seq, seen.fence, StepStatus.FAILED],
                )
            # A turn handed out meanwhile (a freed place) wakes it sooner than it asked.
            given = sql.fetch_one(
                f"SELECT MIN(w.go_at + CASE WHEN w.reason = %s THEN 0 ELSE COALESCE(("
                f"SELECT p.turn_shift FROM {PARTNERS} p WHERE p.partner = w.partner), 0) END) "
                f"- {epoch_now()} FROM {WAITERS} w "
                "WHERE w.partner = %s AND w.run_id = %s AND w.seq = %s AND w.go_at IS NOT NULL",
                [CONCURRENCY, partner, run_id, seq],
            )
            if given is not None and given[0] is not None:
                seconds = max(0.0, min(seconds, float(given[0])))
            token = f"{PARTNER_HOLD}:{partner}"
            before = sql.fetch_one(
                f"SELECT hold FROM {sql.RUNS} WHERE id = %s"
                + (" FOR UPDATE" if sql.postgres() else ""),
                [run_id],
            )
            assignments, values = sql.set_clause(
                {
                    "status": RunStatus.WAITING,
                    "wake_at": sql.at_now_plus(seconds),
                    "updated_at": sql.at_now(),
                    "hold": token,
                }
            )
            row = sql.fetch_one(
                f"UPDATE {sql.RUNS} SET {assignments} WHERE {_RUN_AT_STEP} RETURNING build, pinned",
                [*values, run_id, seq, *ACTIVE],
            )
            if row is None:
                raise Fenced
            build, pinned = row[0], bool(row[1])
            if before is None or before[0] != token or not _same_held_reason(run_id, seq, why):
                event_add(run_id, RunEvent.Kind.HELD, why, seq=seq, data={"hold": token})
            if seconds <= dispatch.MAX_COUNTDOWN_SECONDS:
                dispatch.send_step_on_commit(
                    run_id, seq, countdown=seconds or None, queue=builds.route(build, pinned)
                )
    except Fenced:
        return False
    return True


def _same_held_reason(run_id: str, seq: int, why: str) -> bool:
    """Did the run's last held event at `seq` say exactly this?"""
    row = sql.fetch_one(
        f"SELECT detail FROM {sql.EVENTS} WHERE run_id = %s AND kind = %s AND seq = %s "
        "ORDER BY id DESC LIMIT 1",
        [run_id, RunEvent.Kind.HELD, seq],
    )
    return row is not None and row[0] == why
