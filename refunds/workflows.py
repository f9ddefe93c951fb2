"""The refund workflow (SPEC §5): the ordered steps and nothing else."""

from __future__ import annotations

from agentflow import durable
from refunds import steps

#: Stripe keeps idempotency keys for at least 24 hours; older retries reconcile first.
STRIPE_KEY_WINDOW_SECONDS = 24 * 3600
#: Partner calls retry fast and briefly: 5 attempts within about 2-4 s, all under one key. A
#: partner still failing then is treated as down: the run fails, refunds any fee and tells the
#: customer, rather than holding their money while we wait.
PARTNER_RETRY = durable.RetryPolicy(max_attempts=5, base_seconds=0.25, max_seconds=30)
#: Undoing gives up much later (about a minute): if it fails, an operator must step in.
COMPENSATION_RETRY = durable.RetryPolicy(max_attempts=8, base_seconds=0.5, max_seconds=60)

refund = durable.Workflow("refund", version=1, on_failure="notify_failure")

refund.step("load_request", kind="read")(steps.load_request)
refund.step("parse_flight_details", kind="read")(steps.parse_flight_details)
refund.step("fetch_booking", kind="read", retry=PARTNER_RETRY)(steps.fetch_booking)
refund.step("check_cancellation_policy", kind="read")(steps.check_cancellation_policy)
refund.step("calculate_penalty_fee", kind="read")(steps.calculate_penalty_fee)
refund.step("cancel_seat", kind="effect", retry=PARTNER_RETRY)(steps.cancel_seat)
refund.step(
    "charge_customer",
    kind="effect",
    retry=PARTNER_RETRY,
    reconcile=steps.find_fee_payment,
    compensate="refund_fee",
    key_window_seconds=STRIPE_KEY_WINDOW_SECONDS,
)(steps.charge_customer)
refund.step("issue_boarding_pass", kind="effect", retry=PARTNER_RETRY)(steps.issue_boarding_pass)
refund.step("update_crm", kind="effect", retry=PARTNER_RETRY)(steps.update_crm)
refund.step("send_confirmation_email", kind="effect", retry=PARTNER_RETRY)(
    steps.send_confirmation_email
)

refund.compensation(
    "refund_fee", retry=COMPENSATION_RETRY, key_window_seconds=STRIPE_KEY_WINDOW_SECONDS
)(steps.refund_fee)
refund.compensation("notify_failure", retry=COMPENSATION_RETRY)(steps.notify_failure)
