"""The invariants (docs/protocol.md, "Invariants"), checked after a chaos run against the partners'
ledger and our rows.

Each check returns the list of violations it found (empty: the invariant held). What a check
can and cannot see from outside the workers is said in `NOTES`, which the report prints.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

from agentflow._base.states import TERMINAL_RUN_STATUSES, RunStatus, StepStatus
from refunds.chaos.evidence import EFFECT_STEPS, NONE_PER_COMPLETED, ONE_PER_REFUND, Evidence

#: Endpoints whose client makes exactly one request per step attempt (plain HTTP, no client
#: retries), so partner-side requests can be held to recorded attempts. Stripe is left out:
#: the stripe library retries on its own under the same key.
ONE_REQUEST_PER_ATTEMPT = {
    "airline.cancel_seat": "cancel_seat",
    "airline.boarding_pass": "issue_boarding_pass",
    "crm.update": "update_crm",
}

#: What a completed refund makes for its fee: none at all once its waiver was approved.
FEE_EFFECTS = ("authorizations", "payments")

NOTES = {
    "I1": "at the sandbox: no idempotency key with more than one effect in any ledger list; "
    "each COMPLETED refund has exactly one fee hold, payment (its capture), seat "
    "cancellation, boarding pass, CRM update and confirmation e-mail (no hold or payment once "
    "an approver waived its fee), and no refund, hold "
    "release or seat reinstatement; any other run at most one of each; failure notices one per "
    "failure (a failed run an operator retried or forked is told of each)",
    "I2": "every run reached COMPLETED, FAILED or CANCELLED before the deadline",
    "I3": "executions are not visible from outside the workers; checked instead: every "
    "COMPLETED effect step has exactly one partner effect under its key, and partner requests "
    "never outnumber recorded attempts (airline and CRM totals per endpoint; e-mail deliveries "
    "per Message-ID), so no request came from a re-run that skipped the claim",
    "I4": "every partner effect carries the key of one of our effect checkpoints, whose first "
    "claim was committed no later than the partner recorded the effect",
    "I5": "not checked here (fencing has its own crash tests)",
    "I6": "not checked here; sweeper re-enqueues and reconciles are counted under 'events'",
    "I7": "every run not finished has a live lease, a wake-up time, or is NEEDS_ATTENTION",
    "I8": "money and seats, counted at the sandbox: a FAILED or CANCELLED run keeps no money "
    "(payments captured minus refunds), holds nothing on the card, and has given back any "
    "seat it released; a NEEDS_ATTENTION run says why; a COMPLETED one kept exactly its fee (I1)",
}


def check_all(evidence: Evidence, now: datetime) -> dict[str, list[str]]:
    return {
        "I1": i1_one_effect(evidence),
        "I2": i2_terminal(evidence),
        "I3": i3_no_rerun(evidence),
        "I4": i4_claim_before_effect(evidence),
        "I7": i7_owned(evidence, now),
        "I8": i8_no_money_kept(evidence),
    }


def i1_one_effect(evidence: Evidence) -> list[str]:
    problems = []
    for kind in EFFECT_STEPS:
        keys = Counter(e.key for e in evidence.effects_of(kind))
        problems += [f"{kind}: {n} effects under key {key}" for key, n in keys.items() if n > 1]
        strangers = [e.key for e in evidence.effects_of(kind) if e.workflow_id not in evidence.runs]
        problems += [f"{kind}: effect {key} names no run of this chaos run" for key in strangers]
    confirmations = evidence.confirmations()
    for kind in (*ONE_PER_REFUND, *NONE_PER_COMPLETED):
        for run_id, n in evidence.per_refund(kind).items():
            completed = evidence.runs[run_id].status == RunStatus.COMPLETED
            expected = (0 if kind in NONE_PER_COMPLETED else 1) if completed else None
            if completed and run_id in evidence.waived and kind in FEE_EFFECTS:
                expected = 0  # an approved waiver: no fee held, none taken
            # A failed run an operator retried or forked may have told the customer of each
            # failure: a completed one sends exactly one confirmation, beside those. No other
            # effect may be made twice, whatever happened.
            if kind == "emails":
                n = confirmations[run_id]
            if (expected is not None and n != expected) or n > 1:
                problems.append(f"{run_id} ({evidence.runs[run_id].status}): {n} {kind}")
    return problems


def i2_terminal(evidence: Evidence) -> list[str]:
    return [
        f"{run.id} is {run.status} at step {run.current_seq} {run.current_step}"
        for run in evidence.runs.values()
        if run.status not in TERMINAL_RUN_STATUSES
    ]


def i2_settled(evidence: Evidence) -> list[str]:
    """I2 where operators act too (the model-based test's end): every run finished, or parked
    for an operator with its reason."""
    return [
        f"{run.id} never settled: {run.status} at step {run.current_seq} {run.current_step}"
        for run in evidence.runs.values()
        if run.status not in TERMINAL_RUN_STATUSES
        and not (run.status == RunStatus.NEEDS_ATTENTION and run.error)
    ]


def i3_no_rerun(evidence: Evidence) -> list[str]:
    problems = []
    keys = Counter((e.kind, e.key) for e in evidence.effects)
    for cp in evidence.checkpoints.values():
        kinds = evidence.kinds_of(cp.name)
        made = sum(keys[(kind, cp.idempotency_key)] for kind in kinds)
        if kinds and cp.status == StepStatus.COMPLETED and made != 1:
            problems.append(
                f"{cp.idempotency_key} {cp.name} COMPLETED with {made} {'/'.join(kinds)}"
            )
    requests = evidence.ledger.get("requests", {})
    for endpoint, step in ONE_REQUEST_PER_ATTEMPT.items():
        tried = sum(cp.attempts for cp in evidence.checkpoints.values() if cp.name == step)
        if requests.get(endpoint, 0) > tried:
            problems.append(f"{endpoint}: {requests[endpoint]} requests, {tried} attempts")
    for effect in evidence.effects_of("emails"):
        sender = evidence.by_key.get(effect.key)
        if sender is not None and effect.deliveries > sender.attempts:
            problems.append(
                f"{effect.key}: {effect.deliveries} deliveries, {sender.attempts} attempts"
            )
    return problems


def i4_claim_before_effect(evidence: Evidence) -> list[str]:
    problems = []
    for effect in evidence.effects:
        cp = evidence.by_key.get(effect.key)
        if cp is None:
            problems.append(f"{effect.kind} {effect.key}: no checkpoint has this key")
        elif cp.kind != "effect":
            problems.append(f"{effect.kind} {effect.key}: made by a {cp.kind} step {cp.name}")
        elif cp.first_started_at.timestamp() > effect.created:
            problems.append(f"{effect.kind} {effect.key}: effect before the claim committed")
    return problems


def i7_owned(evidence: Evidence, now: datetime) -> list[str]:
    problems = []
    for run in evidence.runs.values():
        if run.status in TERMINAL_RUN_STATUSES or run.status == RunStatus.NEEDS_ATTENTION:
            continue
        cp = evidence.checkpoints.get((run.id, run.current_seq))
        leased = (
            cp is not None
            and cp.status == StepStatus.IN_PROGRESS
            and cp.lease_expires_at is not None
            and cp.lease_expires_at > now
        )
        if run.wake_at is None and not leased:
            problems.append(f"{run.id} is {run.status} with no lease and no wake-up time")
    return problems


def i8_no_money_kept(evidence: Evidence) -> list[str]:
    problems = []
    kept_by_run = evidence.money_kept()
    held = Counter(
        a.get("workflow_id")
        for a in evidence.ledger.get("authorizations", [])
        if a.get("status") == "requires_capture"
    )
    released = evidence.per_refund("seat_cancellations")
    given_back = evidence.per_refund("seat_reinstatements")
    for run in evidence.runs.values():
        kept = kept_by_run[run.id]
        if run.status in (RunStatus.FAILED, RunStatus.CANCELLED):
            if kept:
                problems.append(f"{run.id} is {run.status} and keeps {kept} cents")
            if held[run.id]:
                problems.append(f"{run.id} is {run.status} and still holds a fee on the card")
            if released[run.id] > given_back[run.id]:
                problems.append(f"{run.id} is {run.status} and kept the customer's seat")
        if run.status == RunStatus.NEEDS_ATTENTION and not run.error:
            problems.append(f"{run.id} needs attention without a reason")
        if run.status == RunStatus.COMPLETED and run.id in evidence.waived and kept:
            problems.append(f"{run.id} had its fee waived and keeps {kept} cents")
        if kept < 0:
            problems.append(f"{run.id} refunded {-kept} cents more than it took")
    return problems
