"""Erasing a person (docs/privacy.md, "Erasure"): their subject keys destroyed, their runs kept.

Shared by `manage.py agentflow_erase` and the admin's erase action. A run of theirs still in
flight needs its personal fields to finish or to be undone (its compensations read them), so
erasure waits for it: refused, saying which runs, or with `cancel_in_flight` those runs are
cancelled (their compensations run) and erasure is asked again once they have ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentflow import _store as store
from agentflow._base.states import TERMINAL_RUN_STATUSES
from agentflow._privacy import keystore
from agentflow.exceptions import ErasureRefused
from agentflow.models import WorkflowRun

#: The most run ids a refusal names (the count is always given).
NAMED_RUNS = 10


@dataclass(frozen=True, kw_only=True)
class Erasure:
    keys: int
    runs: int


def erase(subject: str, *, actor: str, reason: str, cancel_in_flight: bool = False) -> Erasure:
    """Destroy `subject`'s keys once none of their runs is in flight.

    Raises:
        ErasureRefused: no master key is configured, actor or reason is missing, or runs of
            the subject are still in flight (cancelled first with `cancel_in_flight`).
    """
    subject, actor, reason = subject.strip(), actor.strip(), reason.strip()
    if not subject:
        raise ErasureRefused("name the subject to erase (as the workflow's Personal names it)")
    if not actor or not reason:
        raise ErasureRefused("an erasure is recorded with who asked for it and why: give both")
    if not keystore.enabled():
        raise ErasureRefused(
            "no master key is configured (AGENTFLOW_MASTER_KEYS): nothing was sealed, so "
            "there is no key to destroy"
        )
    runs = keystore.runs_of(subject)
    live = list(
        WorkflowRun.objects.filter(id__in=runs)
        .exclude(status__in=TERMINAL_RUN_STATUSES)
        .order_by("created_at")
        .values_list("id", flat=True)
    )
    if live:
        raise ErasureRefused(
            _in_flight(live, actor, reason)
            if cancel_in_flight
            else (
                f"{len(live)} run(s) of this subject are still in flight ({_named(live)}): they "
                "need the data to finish or be undone. Cancel them (--cancel-in-flight) or wait "
                "for them to end, then erase again"
            )
        )
    found = store.subject_erase(subject, actor=actor, reason=reason)
    return Erasure(keys=found.keys, runs=found.runs)


def _in_flight(live: list[str], actor: str, reason: str) -> str:
    """Cancel each run in flight; the refusal that says what happened."""
    cancelled, refused = [], []
    for run_id in live:
        try:
            store.run_cancel(run_id, actor=actor, reason=f"erasure requested: {reason}")
            cancelled.append(run_id)
        except store.ActionRefused as exc:
            refused.append(f"{run_id}: {exc}")
    said = f"cancelling {len(cancelled)} run(s) ({_named(cancelled)}) with their compensations"
    if refused:
        said += f"; could not cancel {len(refused)}: {'; '.join(refused[:NAMED_RUNS])}"
    return f"{said}. Erase again once they have ended"


def _named(run_ids: list[str]) -> str:
    shown = ", ".join(run_ids[:NAMED_RUNS])
    return shown + (f" and {len(run_ids) - NAMED_RUNS} more" if len(run_ids) > NAMED_RUNS else "")
