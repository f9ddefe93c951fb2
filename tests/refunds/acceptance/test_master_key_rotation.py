"""A master key rotated during a burst of refunds (issue 42, docs/privacy.md "Rotating the master
key"): workers of the old key and of both keep going, one is SIGKILLed mid-burst, the keys are
re-wrapped in small batches meanwhile; no run fails, and afterwards the old key can go."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.test import override_settings

from agentflow import durable
from agentflow._privacy import keys, keystore
from agentflow.models import StepCheckpoint, SubjectKey
from agentflow.testing.processes import WorkerProcess
from agentflow.testing.waiting import wait_for
from refunds.models import RefundRequest
from refunds.sandbox.airline import owner_of
from tests.support.refunds import partner_effects, refund_worker_env, submit
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

OLD = "old:" + keys.b64encode(b"O" * 32)
NEW = "new:" + keys.b64encode(b"N" * 32)


@pytest.fixture
def keys_old() -> Iterator[None]:
    keystore.forget_cached()
    with override_settings(AGENTFLOW_MASTER_KEYS=[OLD]):
        yield
    keystore.forget_cached()


def worker(sandbox: SandboxProcess, master_keys: str, *, beat: bool) -> WorkerProcess:
    env = refund_worker_env(sandbox, AGENTFLOW_MASTER_KEYS=master_keys)
    return WorkerProcess(concurrency=2, env=env, beat=beat).start(timeout=90)


def all_finished(run_ids: list[str], *alive: WorkerProcess) -> list[durable.RunSnapshot]:
    def done() -> list[durable.RunSnapshot] | None:
        for process in alive:
            assert process.alive(), process.log_tail()
        runs = [durable.snapshot(run_id) for run_id in run_ids]
        return runs if all(r is not None and r.finished for r in runs) else None  # type: ignore[return-value]

    return wait_for(done, timeout=240, interval=0.2, what=f"{len(run_ids)} refunds to finish")


def test_rotation_during_a_burst__no_run_fails__then_the_old_key_can_go(
    keys_old: None, clean_sandbox: SandboxProcess, capsys: Any
) -> None:
    old_worker = worker(clean_sandbox, OLD, beat=False)
    both = None
    try:
        first = [submit(f"ROT{i:03d}") for i in range(6)]
        # The new key is deployed first, before the old one, everywhere: a worker with both
        # replaces the old-key one, which is SIGKILLed mid-burst (its steps are taken over);
        # then, with the runs still going, the keys are re-wrapped.
        both = worker(clean_sandbox, f"{NEW},{OLD}", beat=True)
        old_worker.kill()
        with override_settings(AGENTFLOW_MASTER_KEYS=[NEW, OLD]):
            keystore.forget_cached()
            call_command("agentflow_rotate_keys", batch=1)
            later = [submit(f"ROT{i:03d}") for i in range(6, 9)]
            call_command("agentflow_rotate_keys", batch=2)  # keys made since, by either
            runs = all_finished(first + later, both)
    finally:
        old_worker.kill()
        if both is not None:
            both.kill()

    assert [r.status for r in runs] == [durable.RunStatus.COMPLETED] * 9, [r.error for r in runs]
    said = capsys.readouterr().out
    assert "re-wrapped 1 of " in said and "done: every live key is wrapped by new" in said
    assert set(keystore.wrapped_by()) == {"new"}
    # The old key removed: every customer's details still open, every effect happened once.
    with override_settings(AGENTFLOW_MASTER_KEYS=[NEW]):
        keystore.forget_cached()
        for i, run_id in enumerate(first + later):
            owner = owner_of(f"ROT{i:03d}")
            booked = StepCheckpoint.objects.get(run_id=run_id, name="fetch_booking").output
            assert booked["contact_email"] == owner.email
            assert RefundRequest.objects.get(workflow_id=run_id).email == owner.email
            ledger = partner_effects(clean_sandbox, run_id)  # one effect per key (I1)
            assert len(ledger["boarding_passes"]) == 1
    assert SubjectKey.objects.filter(master_key_id="old").count() == 0
