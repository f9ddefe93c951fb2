"""The chaos run's one JSON report: outcomes, kills, effects, recovery times, invariants."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from agentflow._base.states import RunStatus, StepStatus
from refunds.chaos import invariants
from refunds.chaos.evidence import Evidence, attempts, duplicates, histogram
from refunds.chaos.kills import BROKER, CHILD, POSTGRES, WORKER, Kill
from refunds.chaos.traffic import Submission

EMAIL_EXPLANATION = (
    "SMTP has no idempotency key: when a worker dies (or the connection drops) after the mail "
    "server accepted the message but before the step's checkpoint commits, the retry sends it "
    "again under the same deterministic Message-ID. The sink counts that as another delivery of "
    "one message, as a receiving mail system that drops duplicate Message-IDs would; "
    "distinct_per_refund is the number of different messages each customer got."
)
#: Violations listed per invariant; the counts are always complete.
MAX_LISTED = 10


def _epoch(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment else None


def recovery(evidence: Evidence, kills: list[Kill]) -> dict[str, Any]:
    """Seconds from each kill until the work it interrupted was done again.

    Child and worker kills: each step IN_PROGRESS under a killed pid's lease, until it was
    COMPLETED; database restarts: each step IN_PROGRESS at the crash, likewise. Broker
    restart: each run whose step message the broker held, until that run recorded its next
    checkpoint (and, apart, until the sweeper re-enqueued it). A step that finished before
    the kill landed is no sample. Every sample includes the wait behind the
    other queued work, which after a broker restart is every run at once.
    """
    samples: dict[str, list[float]] = {CHILD: [], WORKER: [], BROKER: [], POSTGRES: []}
    requeued: list[float] = []
    unrecovered = 0
    for kill in kills:
        for step in kill.leased:
            if step.run_id not in evidence.runs:
                continue
            cp = evidence.checkpoints.get((step.run_id, step.seq))
            done = _epoch(cp.finished_at) if cp and cp.status == StepStatus.COMPLETED else None
            if done is None:
                unrecovered += 1
            elif not (cp and cp.attempts == step.attempts and done < kill.at):
                samples[kill.kind].append(done - kill.at)
        for run_id in sorted({r for r, _ in kill.lost_messages if r in evidence.runs}):
            lost_seq = min(seq for r, seq in kill.lost_messages if r == run_id)
            later = [
                moment.timestamp()
                for (r, seq), cp in evidence.checkpoints.items()
                if r == run_id and seq >= lost_seq
                for moment in cp.times()
                if moment.timestamp() >= kill.at
            ]
            if later:
                samples[kill.kind].append(min(later) - kill.at)
            sweeps = [at for at in evidence.requeues.get(run_id, []) if at >= kill.at]
            if sweeps:
                requeued.append(sweeps[0] - kill.at)
            elif evidence.runs.get(run_id) and evidence.runs[run_id].status != RunStatus.COMPLETED:
                unrecovered += 1
    everything = [s for values in samples.values() for s in values]
    return {
        **_percentiles(everything),
        "unrecovered": unrecovered,
        "by_kind": {kind: _percentiles(values) for kind, values in samples.items()},
        "broker_lost_runs_requeued_by_sweeper_after": _percentiles(requeued),
    }


def _percentiles(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)

    def rank(q: float) -> float | None:
        if not ordered:
            return None
        return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 3)

    return {"p50": rank(0.5), "p99": rank(0.99), "max": rank(1.0), "samples": len(ordered)}


def model(evidence: Evidence) -> dict[str, Any]:
    """Agent runs: the model requests the sandbox answered against the turns runs recorded.
    A turn is asked again only when its answer was lost before its checkpoint committed (a
    crash, a dropped answer); a recorded turn is never asked again."""
    requests = int(evidence.ledger.get("requests", {}).get("llm.chat", 0))
    turns = sum(
        1 for cp in evidence.checkpoints.values() if cp.name == "llm" and cp.status == "COMPLETED"
    )
    return {"requests_made": requests, "turns_recorded": turns, "asked_again": requests - turns}


def build(
    *,
    evidence: Evidence,
    submissions: list[Submission],
    kills: list[Kill],
    planned_kills: dict[str, int],
    t0: float,
    finished: float,
    seed: int,
    config: dict[str, Any],
) -> dict[str, Any]:
    statuses = [run.status for run in evidence.runs.values()]
    broken = invariants.check_all(evidence, datetime.now(UTC))
    doubles = [s for s in submissions if s.same_refund is not None]
    emails = evidence.per_refund("emails")
    return {
        "runs": len(evidence.runs),
        "completed": statuses.count(RunStatus.COMPLETED),
        "failed": statuses.count(RunStatus.FAILED),
        "cancelled": statuses.count(RunStatus.CANCELLED),
        "needs_attention": statuses.count(RunStatus.NEEDS_ATTENTION),
        "stuck": sum(
            1 for s in statuses if s in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)
        ),
        "submission_errors": [s.error for s in submissions if s.error][:MAX_LISTED],
        #: Customers' reloads and re-sent forms while the database was down (same token).
        "submission_database_retries": sum(s.database_retries for s in submissions),
        "kills": {
            "children": sum(1 for k in kills if k.kind == CHILD),
            "workers": sum(1 for k in kills if k.kind == WORKER),
            "broker_restarts": sum(1 for k in kills if k.kind == BROKER),
            "postgres_restarts": sum(1 for k in kills if k.kind == POSTGRES),
            "planned": planned_kills,
            "log": [kill.as_json(t0) for kill in kills],
        },
        "payments_per_refund": histogram(evidence.per_refund("payments")),
        "seat_cancellations_per_refund": histogram(evidence.per_refund("seat_cancellations")),
        "boarding_passes_per_refund": histogram(evidence.per_refund("boarding_passes")),
        "crm_updates_per_refund": histogram(evidence.per_refund("crm_updates")),
        "fee_refunds_per_refund": histogram(evidence.per_refund("refunds")),
        "duplicate_effects": duplicates(evidence),
        "emails": {
            "distinct_per_refund": histogram(emails),
            "duplicate_deliveries": evidence.ledger.get("duplicate_email_deliveries", 0),
            "explanation": EMAIL_EXPLANATION,
        },
        "recovery_seconds": recovery(evidence, kills),
        "double_submits": {
            "sent": len(doubles),
            "same_refund": sum(1 for s in doubles if s.same_refund),
        },
        "attempts": attempts(evidence),
        "partner": {
            "requests": evidence.ledger.get("requests", {}),
            "replays": evidence.ledger.get("replays", {}),
        },
        "events": dict(sorted(evidence.events.items())),
        **({"model": model(evidence)} if config.get("engine") == "agent" else {}),
        "invariants": {name: not problems for name, problems in broken.items()},
        "violations": {
            name: {"count": len(problems), "examples": problems[:MAX_LISTED]}
            for name, problems in broken.items()
            if problems
        },
        "invariant_checks": invariants.NOTES,
        "seed": seed,
        "config": config,
        "elapsed_seconds": round(finished - t0, 1),
    }
