"""What a chaos run left behind, read back: the runs and checkpoints, and the partners' ledger.

Partner effects are counted at the sandbox (docs/protocol.md, "I1: one effect per key": "counted at
the partner, not by us"); the database says what the engine believes. The invariants compare the
two.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection

from agentflow._base.states import WaitKind
from agentflow.models import RunEvent, RunWait, StepCheckpoint, WorkflowRun
from refunds import waivers

#: Ledger lists, and the refund step whose idempotency key each effect carries. `payments` is
#: money taken (the hold's capture); `refund_fee` either releases a hold or refunds a fee taken.
EFFECT_STEPS = {
    "authorizations": "charge_customer",
    "payments": "capture_fee",
    "refunds": "refund_fee",
    "authorization_cancels": "refund_fee",
    "seat_cancellations": "cancel_seat",
    "seat_reinstatements": "reinstate_seat",
    "boarding_passes": "issue_boarding_pass",
    "crm_updates": "update_crm",
    "emails": "send_confirmation_email",
}
#: What a completed refund must have made, exactly once each...
ONE_PER_REFUND = (
    "authorizations",
    "payments",
    "seat_cancellations",
    "boarding_passes",
    "crm_updates",
    "emails",
)
#: ...and what it must not have made at all (undoing belongs to failed runs).
NONE_PER_COMPLETED = ("refunds", "authorization_cancels", "seat_reinstatements")
_MESSAGE_ID_KEY = re.compile(r"^<?(?P<key>[^@<>]+)@")


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    run_id: str
    seq: int
    name: str
    kind: str
    status: str
    attempts: int
    idempotency_key: str
    lease_expires_at: datetime | None
    first_started_at: datetime
    started_at: datetime
    finished_at: datetime | None

    def times(self) -> list[datetime]:
        return [t for t in (self.first_started_at, self.started_at, self.finished_at) if t]


@dataclass(frozen=True, kw_only=True)
class Effect:
    kind: str
    key: str
    workflow_id: str
    created: float
    deliveries: int = 1
    #: Money, for payments and refunds (cents).
    amount: int = 0
    #: E-mails: what the customer was told (a confirmation, or that the change failed).
    confirms: bool = False


@dataclass(kw_only=True)
class Evidence:
    runs: dict[str, WorkflowRun]
    checkpoints: dict[tuple[str, int], Checkpoint]
    by_key: dict[str, Checkpoint]
    effects: list[Effect]
    ledger: dict[str, Any]
    events: Counter[str]
    #: When the sweeper re-enqueued each run (epoch seconds, in order).
    requeues: dict[str, list[float]]
    #: Runs whose fee waiver an approver approved (in any branch): they owe no fee.
    waived: frozenset[str] = frozenset()

    def effects_of(self, kind: str) -> list[Effect]:
        return [e for e in self.effects if e.kind == kind]

    def kinds_of(self, step: str) -> tuple[str, ...]:
        """The ledger lists whose effects `step` makes under its key."""
        return tuple(kind for kind, name in EFFECT_STEPS.items() if name == step)

    def money(self, kind: str) -> dict[str, int]:
        """Cents per run of ours in `kind` (payments or refunds), zeros included. Money kept
        by a run is its payments (captured) minus its refunds."""
        totals: Counter[str] = Counter()
        for effect in self.effects_of(kind):
            totals[effect.workflow_id] += effect.amount
        return {run_id: totals.get(run_id, 0) for run_id in self.runs}

    def money_kept(self) -> dict[str, int]:
        """Cents each run of ours keeps: what the partner took minus what it gave back. The one
        place that says what "money kept" means: payments (with manual capture, a hold's
        capture) minus refunds; a hold alone keeps nothing, and I8 checks holds apart."""
        charged, refunded = self.money("payments"), self.money("refunds")
        return {run_id: charged[run_id] - refunded[run_id] for run_id in self.runs}

    def per_refund(self, kind: str) -> dict[str, int]:
        """Effects of `kind` per run of ours (emails: distinct Message-IDs), zeros included."""
        counts = Counter(e.workflow_id for e in self.effects_of(kind))
        return {run_id: counts.get(run_id, 0) for run_id in self.runs}

    def confirmations(self) -> dict[str, int]:
        """Confirmation e-mails per run of ours: a run an operator resumed after a failure told
        the customer of that failure too, so a completed run's count of all its e-mails says
        less than this does."""
        counts = Counter(e.workflow_id for e in self.effects_of("emails") if e.confirms)
        return {run_id: counts.get(run_id, 0) for run_id in self.runs}


#: How a confirmation e-mail's subject opens (templates/refunds/email/confirmation_subject.txt).
CONFIRMATION_SUBJECT = "Your flight change is confirmed"


def gather(workflow_ids: list[str], ledger: dict[str, Any]) -> Evidence:
    runs = {run.id: run for run in WorkflowRun.objects.filter(id__in=workflow_ids)}
    checkpoints = {}
    for row in StepCheckpoint.objects.filter(run_id__in=workflow_ids).values(
        "run_id",
        "seq",
        "name",
        "kind",
        "status",
        "attempts",
        "idempotency_key",
        "lease_expires_at",
        "first_started_at",
        "started_at",
        "finished_at",
    ):
        cp = Checkpoint(**row)
        checkpoints[(cp.run_id, cp.seq)] = cp
    events: Counter[str] = Counter()
    requeues: defaultdict[str, list[float]] = defaultdict(list)
    for run_id, kind, at in (
        RunEvent.objects.filter(run_id__in=workflow_ids)
        .order_by("at")
        .values_list("run_id", "kind", "at")
    ):
        events[kind] += 1
        if kind == RunEvent.Kind.SWEEP_REQUEUE:
            requeues[run_id].append(at.timestamp())
    waived = RunWait.objects.filter(
        run_id__in=workflow_ids, kind=WaitKind.APPROVAL, name=waivers.STEP, outcome__approved=True
    ).values_list("run_id", flat=True)
    return Evidence(
        waived=frozenset(waived),
        runs=runs,
        checkpoints=checkpoints,
        by_key={cp.idempotency_key: cp for cp in checkpoints.values()},
        effects=_effects(ledger),
        ledger=ledger,
        events=events,
        requeues=dict(requeues),
    )


def _effects(ledger: dict[str, Any]) -> list[Effect]:
    found = []
    for kind in EFFECT_STEPS:
        for entry in ledger.get(kind, []):
            key = str(entry.get("idempotency_key") or "")
            if kind == "emails":
                match = _MESSAGE_ID_KEY.match(str(entry.get("message_id") or key))
                key = match.group("key") if match else key
            found.append(
                Effect(
                    kind=kind,
                    key=key,
                    workflow_id=str(entry.get("workflow_id") or ""),
                    created=float(entry.get("created") or 0.0),
                    deliveries=int(entry.get("deliveries") or 1),
                    amount=int(entry.get("amount") or 0),
                    confirms=str(entry.get("subject") or "").startswith(CONFIRMATION_SUBJECT),
                )
            )
    return found


def histogram(counts: dict[str, int]) -> dict[str, Any]:
    """min, max and how many refunds had each count (keys are the counts, as strings)."""
    values = list(counts.values())
    spread = Counter(values)
    return {
        "min": min(values, default=0),
        "max": max(values, default=0),
        "histogram": {str(n): spread[n] for n in sorted(spread)},
    }


def duplicates(evidence: Evidence) -> dict[str, dict[str, int]]:
    """Per ledger list: idempotency keys with more than one effect, and refunds with more than
    one (for `refunds`, a refund of the fee more than once)."""
    result = {}
    for kind in EFFECT_STEPS:
        effects = evidence.effects_of(kind)
        keys = Counter(e.key for e in effects)
        refunds = Counter(e.workflow_id for e in effects)
        result[kind] = {
            "keys": sum(1 for n in keys.values() if n > 1),
            "refunds": sum(1 for n in refunds.values() if n > 1),
        }
    return result


def attempts(evidence: Evidence) -> dict[str, Any]:
    """Checkpoints that took more than one attempt, by step (retries and recoveries)."""
    retried = Counter(cp.name for cp in evidence.checkpoints.values() if cp.attempts > 1)
    per_step: defaultdict[str, int] = defaultdict(int)
    for cp in evidence.checkpoints.values():
        per_step[cp.name] += cp.attempts
    return {
        "checkpoints": len(evidence.checkpoints),
        "with_attempts_over_1": sum(retried.values()),
        "by_step": dict(sorted(retried.items())),
        "max": max((cp.attempts for cp in evidence.checkpoints.values()), default=0),
        "attempts_by_step": dict(sorted(per_step.items())),
    }


# --- single reads, for the model-based test ----------------------------------------------
def claim_mark(run_id: str, seq: int) -> tuple[Any, ...] | None:
    """What a claim at `seq` is known by: the checkpoint row (a fork deletes it and starts a
    new one, whose fences start again) and its fence."""
    return StepCheckpoint.objects.filter(run_id=run_id, seq=seq).values_list("id", "fence").first()


def run_rows(run_id: str) -> tuple[Any, ...]:
    """One run's row and checkpoints as they stand, events aside: what a fenced-out worker
    must leave exactly as it found them (I5)."""
    run = (
        WorkflowRun.objects.filter(pk=run_id)
        .values(
            "status",
            "current_seq",
            "current_step",
            "error",
            "output",
            "compensations",
            "cancel_requested",
            "branch",
        )
        .first()
    )
    steps = (
        StepCheckpoint.objects.filter(run_id=run_id)
        .order_by("seq")
        .values_list("seq", "name", "status", "fence", "attempts", "output", "error")
    )
    return run, list(steps)


def db_now() -> Any:
    """The database's clock, which every engine decision reads (never this process's)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]
