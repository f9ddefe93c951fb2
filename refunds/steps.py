"""One side effect per step, each carrying the step's idempotency key (being written)."""
from __future__ import annotations

from typing import Any

from agentflow.durable import StepContext


def _todo(ctx: StepContext) -> Any:
    raise NotImplementedError(ctx.step)


load_request = parse_flight_details = fetch_booking = check_cancellation_policy = _todo
calculate_penalty_fee = cancel_seat = charge_customer = find_fee_payment = _todo
issue_boarding_pass = update_crm = send_confirmation_email = refund_fee = notify_failure = _todo
