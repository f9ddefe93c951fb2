"""The refund workflow (docs/refunds.md): the ordered steps and nothing else."""

from __future__ import annotations

from datetime import timedelta

from agentflow import durable
from refunds import flights, priorities, privacy, reconciliation, steps, waivers
from refunds.gateways import (
    COMPENSATION_RETRY,
    PARTNER_RETRY,
    STRIPE_CAPTURE_WINDOW_SECONDS,
    STRIPE_KEY_WINDOW_SECONDS,
)

#: v2: `fetch_booking` checks the requester owns the booking, and mail goes to its contact
#: on file (v1 runs still in flight are parked for an operator rather than guessed at).
#: v3: `check_flight` asks the airline's schedule for the new flight before any effect; the fee
#: is held before the seat is touched (`charge_customer`) and taken after the pass
#: (`capture_fee`); a failure releases the hold or refunds, and gives a released seat back
#: (`reinstate_seat`). v2 runs still in flight are parked for an operator, as v1's were.
#: v4: a fee waiver the customer asked for, and the policy proposes, waits for an operator's
#: approval (`request_fee_waiver`) before the fee is worked out, so before the card or the seat
#: is touched; approved, the fee is 0. v3 runs still in flight were parked, as before.
#: From here on a change ships as an upgrade that runs in flight survive
#: (docs/deploys.md, "Builds"): each run moves to the new build at its next step when every step it
#: recorded is still here, in the same order and kind, and the compensations it may need still
#: exist; otherwise it finishes on its own build's workers. So add steps rather than rename or
#: reorder the ones runs have passed, bump `version`, and run `manage.py agentflow_deploy_check`
#: with the new code first (tests/refunds/acceptance/test_deploys.py deploys a read step just before
#: the fee this way).
refund = durable.Workflow(
    "refund",
    version=4,
    on_failure="notify_failure",
    sensitive_input=waivers.STATUS_PAGE_KEY,
    personal=privacy.REFUND,
    priority=priorities.CUSTOMER,
    concurrency_key=priorities.booking_of,
    concurrency_limit=priorities.PER_BOOKING,
)

refund.step("load_request", kind="read")(steps.load_request)
refund.step("parse_flight_details", kind="read")(steps.parse_flight_details)
refund.step("fetch_booking", kind="read", retry=PARTNER_RETRY)(steps.fetch_booking)
refund.step("check_flight", kind="read", retry=PARTNER_RETRY)(steps.check_flight)
refund.step("check_cancellation_policy", kind="read")(steps.check_cancellation_policy)
refund.step(
    waivers.STEP,
    kind="read",
    requires_approval=waivers.needs_approval,
    approval_arguments=steps.fee_waiver_arguments,
    sensitive=waivers.DETAILS,
    replies=waivers.REPLIES,
)(waivers.request_fee_waiver)
refund.step("calculate_penalty_fee", kind="read")(steps.calculate_penalty_fee)
refund.step(
    "charge_customer",
    kind="effect",
    retry=PARTNER_RETRY,
    reconcile=steps.find_fee_hold,
    compensate="refund_fee",
    key_window_seconds=STRIPE_KEY_WINDOW_SECONDS,
)(steps.charge_customer)
refund.step(
    "cancel_seat",
    kind="effect",
    retry=PARTNER_RETRY,
    reconcile=steps.find_seat_cancellation,
    compensate="reinstate_seat",
)(steps.cancel_seat)
refund.step(
    "issue_boarding_pass", kind="effect", retry=PARTNER_RETRY, reconcile=steps.find_boarding_pass
)(steps.issue_boarding_pass)
# No compensation of its own: the hold's (`refund_fee`) refunds a fee once it is taken.
refund.step(
    "capture_fee",
    kind="effect",
    retry=PARTNER_RETRY,
    reconcile=steps.find_fee_capture,
    key_window_seconds=STRIPE_CAPTURE_WINDOW_SECONDS,
)(steps.capture_fee)
refund.step("update_crm", kind="effect", retry=PARTNER_RETRY, reconcile=steps.find_crm_update)(
    steps.update_crm
)
refund.step("send_confirmation_email", kind="effect", retry=PARTNER_RETRY)(
    steps.send_confirmation_email
)

refund.compensation(
    "refund_fee",
    retry=COMPENSATION_RETRY,
    reconcile=steps.find_fee_refund,
    key_window_seconds=STRIPE_KEY_WINDOW_SECONDS,
)(steps.refund_fee)
refund.compensation(
    "reinstate_seat", retry=COMPENSATION_RETRY, reconcile=steps.find_seat_reinstatement
)(steps.reinstate_seat)
refund.compensation("notify_failure", retry=COMPENSATION_RETRY)(steps.notify_failure)

# Each UTC day's money at Stripe against the refund runs, read only (refunds.reconciliation):
# at 02:00 for the day before; a beat down at 02:00 starts it once when it is back, that day.
reconcile_payments = durable.Workflow("reconcile_payments", version=1)
reconcile_payments.step("list_day_at_stripe", kind="read", retry=PARTNER_RETRY)(
    reconciliation.list_day_at_stripe
)
reconcile_payments.step("match_runs", kind="read")(reconciliation.match_runs)
reconcile_payments.step("email_finance", kind="effect", retry=PARTNER_RETRY)(
    reconciliation.email_finance
)
reconcile_payments.step("settle", kind="read")(reconciliation.settle)
durable.Schedule(
    name="reconcile_payments_nightly",
    workflow="reconcile_payments",
    cron="0 2 * * *",
    time_zone="UTC",
    catch_up=timedelta(hours=22),
    overlap="run_beside",
)

#: A cancelled flight (refunds.flights): one run per airline notice, one refund per passenger
#: started as its children, waited for all together; cancelled or failed, it cancels the
#: refunds still running, each undoing what it did (its fee refunded, its seat given back).
#: It and its refunds run at batch priority, each refund one booking at a time
#: (refunds.priorities): a customer who writes in meanwhile goes first.
flight_cancelled = durable.Workflow("flight_cancelled", version=1, priority=priorities.BATCH)
flight_cancelled.step("read_manifest", kind="read", retry=PARTNER_RETRY)(flights.read_manifest)
flight_cancelled.step(
    "start_refunds",
    kind="effect",
    reconcile=flights.started_refunds,
    compensate="cancel_refunds",
)(flights.start_refunds)
durable.wait_for_children(flight_cancelled, "wait_for_refunds", wait="all")
flight_cancelled.step("email_operations", kind="effect", retry=PARTNER_RETRY)(
    flights.email_operations
)
flight_cancelled.compensation("cancel_refunds", retry=COMPENSATION_RETRY)(durable.cancel_children)

# The same refund as an agent run (REFUNDS_ENGINE=agent), registered with this one.
from refunds.agent.workflow import refund_agent  # noqa: E402, F401
