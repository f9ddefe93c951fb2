"""A refund run's admin page links its refund, the customer's page and its Stripe objects,
through the link hook the refunds app registers (the engine never imports refunds)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.utils import timezone

from agentflow._core import links
from agentflow.models import StepCheckpoint, WorkflowRun
from refunds import links as refund_links
from refunds.engines import GRAPH as WORKFLOW
from refunds.models import RefundRequest

pytestmark = pytest.mark.django_db


def refund_run(*, payment: str | None = "pi_3Nsandbox123") -> tuple[RefundRequest, WorkflowRun]:
    run = WorkflowRun.objects.create(
        workflow=WORKFLOW, version=1, status="COMPLETED", current_step="charge_customer"
    )
    refund = RefundRequest.objects.create(
        email="ana@example.com",
        booking_reference="ABC123",
        message="move me",
        submission_token="t-links",
        workflow_id=run.pk,
    )
    now = timezone.now()
    output: dict[str, Any] = {"authorized": payment is not None, "amount_cents": 4500}
    if payment is not None:
        output["payment_intent_id"] = payment
    StepCheckpoint.objects.create(
        run=run,
        seq=7,
        name="charge_customer",
        kind="effect",
        status="COMPLETED",
        idempotency_key=f"{run.pk}_step_7",
        output=output,
        first_started_at=now,
        started_at=now,
        finished_at=now,
    )
    return refund, run


def test_refund_run_page__links_the_refund_the_status_page_and_the_payment(
    admin_client: Client, settings: Any
) -> None:
    settings.STRIPE_API_BASE = "http://127.0.0.1:8765"
    refund, run = refund_run()

    response = admin_client.get(f"/admin/agentflow/workflowrun/{quote(run.pk)}/change/")

    page = response.content.decode()
    assert f'href="/admin/refunds/refundrequest/{refund.pk}/change/"' in page
    assert f">Refund {refund.public_id}</a>" in page
    assert f'href="/refunds/{refund.public_id}/"' in page
    ledger = f"http://127.0.0.1:8765/_sandbox/ledger?workflow_id={run.pk}"
    assert f'href="{ledger}"' in page and ">pi_3Nsandbox123</a>" in page
    # ...and the refund's own admin page leads back to the run.
    back = admin_client.get(f"/admin/refunds/refundrequest/{refund.pk}/change/")
    assert f"/admin/agentflow/workflowrun/{quote(run.pk)}/change/" in back.content.decode()


def test_refund_run_page__no_payment_no_payment_link(admin_client: Client) -> None:
    _, run = refund_run(payment=None)

    page = admin_client.get(f"/admin/agentflow/workflowrun/{quote(run.pk)}/change/")

    assert "Partner:" not in page.content.decode()


@pytest.mark.parametrize(
    ("key", "step", "field", "expected"),
    [
        ("sk_test_abc", "charge_customer", "payment_intent_id", "test/payments/pi_1"),
        ("sk_live_abc", "charge_customer", "payment_intent_id", "payments/pi_1"),
        ("sk_test_abc", "refund_fee", "refund_id", "test/refunds/pi_1"),
    ],
)
def test_stripe_links__real_stripe_points_at_the_dashboard(
    settings: Any, key: str, step: str, field: str, expected: str
) -> None:
    settings.STRIPE_API_BASE = ""
    settings.STRIPE_API_KEY = key
    run = links.RunRef(
        id="wf_1", workflow=WORKFLOW, version=1, business_key=None, input={}, status="COMPLETED"
    )
    made = links.StepRef(
        seq=7, name=step, kind="effect", status="COMPLETED", output={field: "pi_1"}
    )

    [link] = refund_links.stripe_links(run, made)

    assert link.url == f"https://dashboard.stripe.com/{expected}"
    assert link.label == "pi_1"


@pytest.mark.parametrize("output", [None, "text", {"payment_intent_id": None}, {"other": "x"}])
def test_stripe_links__odd_outputs_give_no_link(output: Any) -> None:
    run = links.RunRef(
        id="wf_1", workflow=WORKFLOW, version=1, business_key=None, input={}, status="FAILED"
    )
    made = links.StepRef(
        seq=7, name="charge_customer", kind="effect", status="FAILED", output=output
    )

    assert refund_links.stripe_links(run, made) == []
