"""The refund workflow (SPEC §5): the ordered steps and nothing else."""
from __future__ import annotations

from agentflow import durable
from refunds import steps

#: Stripe keeps idempotency keys for at least 24 hours; older retries reconcile first.
STRIPE_KEY_WINDOW_SECONDS = 24 * 3600

refund = durable.Workflow("refund", version=1, on_failure="notify_failure")

refund.step("load_request", kind="read")(steps.load_request)
refund.step("parse_flight_details", kind="read")(steps.parse_flight_details)
refund.step("fetch_booking", kind="read")(steps.fetch_booking)
refund.step("check_cancellation_policy", kind="read")(steps.check_cancellation_policy)
refund.step("calculate_penalty_fee", kind="read")(steps.calculate_penalty_fee)
refund.step("cancel_seat", kind="effect")(steps.cancel_seat)
refund.step(
    "charge_customer",
    kind="effect",
    reconcile=steps.find_fee_payment,
    compensate="refund_fee",
    key_window_seconds=STRIPE_KEY_WINDOW_SECONDS,
)(steps.charge_customer)
refund.step("issue_boarding_pass", kind="effect")(steps.issue_boarding_pass)
refund.step("update_crm", kind="effect")(steps.update_crm)
refund.step("send_confirmation_email", kind="effect")(steps.send_confirmation_email)

refund.compensation("refund_fee", key_window_seconds=STRIPE_KEY_WINDOW_SECONDS)(steps.refund_fee)
refund.compensation("notify_failure")(steps.notify_failure)
