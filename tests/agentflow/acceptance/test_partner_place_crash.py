"""A place in flight held by a worker that is SIGKILLed (docs/partner-limits.md, "What happens";
docs/protocol.md, "Liveness"): real worker processes, a real SIGKILL at a named point inside a
limited partner call (between taking the place and giving it back). The place is freed as soon as
the process is gone, through its liveness lock, not when its lease runs out; the run waiting for it
gets it, and each effect happens once.
"""

from __future__ import annotations

import pytest

from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow.models import PartnerSlot, PartnerWaiter, StepCheckpoint, WorkflowRun
from agentflow.testing.waiting import wait_for
from tests.support import partner, workflows
from tests.support.processes import Workers, log_has

pytestmark = pytest.mark.django_db(transaction=True)

KILL_AT = "hold_place:in_partner_call"
#: Far longer than the test may take: a place that comes free was freed by its process dying.
SLOT_SECONDS = 3600


def _finished(run_id: str) -> WorkflowRun:
    def done() -> WorkflowRun | None:
        run = WorkflowRun.objects.filter(pk=run_id).first()
        return run if run is not None and run.status not in ACTIVE_RUN_STATUSES else None

    return wait_for(done, timeout=180, interval=0.1, what=f"run {run_id} to finish")


def test_a_worker_killed_holding_a_place__frees_it_when_its_process_is_gone(
    workers: Workers,
) -> None:
    worker = workers.start(
        concurrency=2,
        beat=True,
        AGENTFLOW_FAULTS="1",
        AGENTFLOW_CRASH_AT=KILL_AT,
        AGENTFLOW_PARTNER_LIMITS='{"acme": {"concurrency": 1}}',
        AGENTFLOW_PARTNER_SLOT_SECONDS=str(SLOT_SECONDS),
        AGENTFLOW_SWEEP_INTERVAL="1",
    )
    holder = durable.start(workflows.held_place.name)
    wait_for(
        lambda: partner.executions(holder) or None, timeout=60, what="the holder's call to start"
    )
    [place] = PartnerSlot.objects.filter(partner="acme")  # the holder's, in its call
    assert place.run_id == holder
    waiting = durable.start(workflows.waits_for_place.name)
    wait_for(
        lambda: WorkflowRun.objects.filter(
            pk=waiting, status=RunStatus.WAITING, hold="partner:acme"
        ).first(),
        timeout=60,
        what="the second run to wait for acme's place",
    )
    assert PartnerWaiter.objects.filter(run_id=waiting, reason="concurrency").exists()

    partner.release(holder)  # its effect is made, then its process is SIGKILLed in the call
    wait_for(
        lambda: log_has(worker, f"fault injection: SIGKILL at {KILL_AT}") or None,
        timeout=60,
        what="the SIGKILL inside the partner call",
    )

    run = _finished(waiting)
    assert run.status == RunStatus.COMPLETED, run.error
    # The dead call's place was never given back and its lease runs an hour: it came free
    # because its process was gone (its liveness lock), and went to the run waiting for it.
    assert place.lease_expires_at > place.started_at.timestamp() + SLOT_SECONDS - 60
    run = _finished(holder)
    assert run.status == RunStatus.COMPLETED, run.error
    hold = StepCheckpoint.objects.get(run_id=holder, name="hold_place")
    after = StepCheckpoint.objects.get(run_id=waiting, name="after_place")
    assert hold.attempts == 2  # the killed attempt, then its takeover
    # Each effect once at the partner, the killed one's included (its key made it safe).
    assert partner.effects() == {hold.idempotency_key: 1, after.idempotency_key: 1}
    assert partner.requests()[hold.idempotency_key] == 2
    # The dead call's row goes with the sweeper's next pass; nothing else was left behind.
    wait_for(
        lambda: not PartnerSlot.objects.exists() or None, timeout=60, what="the dead place's row"
    )
    assert not PartnerWaiter.objects.exists()
