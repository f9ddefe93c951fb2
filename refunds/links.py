"""Where a refund run's records live, for the run's admin page: the refund it serves, the
customer's status page, and the Stripe object each payment step made.

Registered with the engine in `RefundsConfig.ready()`; the engine calls these, never imports them.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.admin.utils import quote
from django.urls import reverse
from django.utils.http import urlencode

from agentflow import durable
from refunds.models import RefundRequest

#: Steps whose output names a Stripe object, and the output field holding its id (a hold and
#: its capture are the same payment intent; a released hold has no refund to link).
STRIPE_OBJECTS = {
    "charge_customer": "payment_intent_id",
    "capture_fee": "payment_intent_id",
    "refund_fee": "refund_id",
}


def refund_links(run: durable.RunRef) -> list[durable.Link]:
    """The refund whose run this is (one query, by the unique workflow_id)."""
    found = RefundRequest.objects.filter(workflow_id=run.id).values_list("pk", "public_id").first()
    if found is None:
        return []
    pk, public_id = found
    return [
        durable.Link(
            label=f"Refund {public_id}",
            url=reverse("admin:refunds_refundrequest_change", args=[quote(pk)]),
            title="What the customer asked for",
        ),
        durable.Link(
            label="Customer's status page",
            url=reverse("refunds:status", args=[public_id]),
            title="The page the customer watches",
        ),
    ]


def stripe_links(run: durable.RunRef, step: durable.StepRef) -> list[durable.Link]:
    """The payment (or refund) a step made, by its Stripe id, from the step's recorded output."""
    field = STRIPE_OBJECTS.get(step.name.split("@", 1)[0])  # an agent's refund_fee@7 too
    output = step.output if isinstance(step.output, dict) else {}
    if isinstance(output.get("result"), dict):  # an agent run's tool call: {"ok", "result"}
        output = output["result"]
    object_id = output.get(field) if field else None
    if not isinstance(object_id, str) or not object_id:
        return []
    if settings.STRIPE_API_BASE:  # the sandbox stands in for Stripe: its ledger shows the object
        base = settings.STRIPE_API_BASE.rstrip("/")
        url = f"{base}/_sandbox/ledger?{urlencode({'workflow_id': run.id})}"
        where = "the partner sandbox's ledger for this run"
    else:
        mode = "test/" if settings.STRIPE_API_KEY.startswith(("sk_test_", "rk_test_")) else ""
        kind = "refunds" if field == "refund_id" else "payments"
        url = f"https://dashboard.stripe.com/{mode}{kind}/{object_id}"
        where = "the Stripe dashboard"
    return [durable.Link(label=object_id, url=url, title=f"Open {object_id} in {where}")]
