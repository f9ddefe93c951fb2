"""A burst of refunds against a Stripe that allows 5 requests a second (issue 27): real worker
processes, the real `stripe` library, the sandbox playing the limited partner and counting.

The smaller, deterministic cut of the issue's acceptance; the full 150-refund runs are the
chaos command's `partner-limits` scenario (docs/partner-limits.md gives the figures). Nothing
here times anything: the limits are checked as the sandbox counted them, and waits poll with
deadlines.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from agentflow import durable
from agentflow.models import PartnerEvent, PartnerState
from agentflow.testing.processes import WorkerProcess
from agentflow.testing.waiting import wait_for
from tests.support.refunds import finished, partner_effects, refund_worker_env, step, submit
from tests.support.sandbox import SandboxProcess

pytestmark = pytest.mark.django_db(transaction=True)

RATE = 5
BURST = 20
STRIPE_ENDPOINTS = ("payment_intents.create", "payment_intents.capture")


def _worker(sandbox: SandboxProcess, **env: str) -> WorkerProcess:
    return WorkerProcess(
        concurrency=4,
        env=refund_worker_env(
            sandbox,
            AGENTFLOW_FAULTS="0",
            AGENTFLOW_PARTNER_LIMITS=json.dumps({"stripe": {"rate": f"{RATE}/s"}}),
            REFUNDS_PARTNER_RETRY_BASE_SECONDS="0.25",
            **env,
        ),
        beat=True,
    )


@pytest.fixture
def limited_stripe(clean_sandbox: SandboxProcess) -> SandboxProcess:
    clean_sandbox.set_limits(stripe={"rate": RATE})
    return clean_sandbox


@pytest.fixture
def worker(limited_stripe: SandboxProcess, transactional_db: None) -> Iterator[WorkerProcess]:
    process = _worker(limited_stripe, AGENTFLOW_BREAKER_COOLDOWN_SECONDS="1")
    try:
        yield process.start(timeout=60)
    finally:
        process.kill()


def _all_complete_with_one_payment(
    runs: list[str], worker: WorkerProcess, sandbox: SandboxProcess
) -> list[durable.RunSnapshot]:
    done = [finished(run_id, worker, timeout=180) for run_id in runs]
    for run in done:
        assert run.status == durable.RunStatus.COMPLETED, (run.id, run.status, run.error)
        ledger = partner_effects(sandbox, run.id)
        assert len(ledger["payments"]) == 1, ledger
    return done


def test_burst__stripe_sees_at_most_its_limit__every_refund_completes(
    worker: WorkerProcess, limited_stripe: SandboxProcess
) -> None:
    runs = [submit(f"LIM{n:03d}") for n in range(BURST)]

    _all_complete_with_one_payment(runs, worker, limited_stripe)

    seen = limited_stripe.limits_report()["stripe"]
    assert seen["requests"] >= 2 * BURST  # a hold and a capture each
    assert seen["most_per_second"] <= RATE + 1  # one extra for clock edges
    assert seen["rate_limited"] <= 3  # a handful at most


def test_stripe_dark_mid_burst__breaker_opens__waiting_runs_spend_no_attempts(
    worker: WorkerProcess, limited_stripe: SandboxProcess
) -> None:
    for endpoint in STRIPE_ENDPOINTS:
        limited_stripe.set_fault(endpoint=endpoint, error_rate=1.0, error_status=503)
    runs = [submit(f"DRK{n:03d}") for n in range(BURST)]

    def opened() -> bool:
        return PartnerEvent.objects.filter(
            partner="stripe", kind=PartnerEvent.Kind.BREAKER_OPEN
        ).exists()

    wait_for(opened, timeout=120, what="Stripe's breaker to open")
    # Held for the partner (a `partner:stripe` routing hold), the reason on the run's one surface.
    wait_for(
        lambda: any("breaker open" in getattr(durable.snapshot(r), "held", "") for r in runs),
        timeout=60,
        what="runs waiting for the breaker",
    )
    limited_stripe.clear_faults()  # Stripe is back

    done = _all_complete_with_one_payment(runs, worker, limited_stripe)

    assert PartnerState.objects.get(partner="stripe").breaker == "closed"
    charges = [step(run, "charge_customer").attempts for run in done]
    failures = PartnerEvent.objects.filter(partner="stripe", kind=PartnerEvent.Kind.ERROR)
    # An attempt is spent only on a failure Stripe answered (what opened the breaker, and
    # each probe the breaker sent): the waits cost none.
    assert sum(a - 1 for a in charges) <= failures.count()
    seen = limited_stripe.limits_report()["stripe"]
    assert seen["most_per_second"] <= RATE + 1
