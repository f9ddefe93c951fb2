"""The only code that writes or locks engine rows: create, claim, complete, fail, advance, park.

Every claim and completion is a compare-and-set whose row count decides; nothing here calls a
partner. Step messages are published only from on-commit hooks.
"""

from __future__ import annotations

from agentflow.store.operator import run_resume
from agentflow.store.runs import (
    ActionRefused,
    Fenced,
    attempt_lost,
    compensation_plan,
    enqueue_grace,
    event_add,
    outputs_load,
    run_cancel,
    run_create,
    run_park,
    run_retry,
    step_fail,
)
from agentflow.store.steps import (
    CheckpointRow,
    Claim,
    StepState,
    claim_blocker,
    lease_renew,
    state_load,
    state_load_claiming,
    step_claim,
    step_complete,
    unclaimed_complete,
)
from agentflow.store.sweeps import Heartbeat, heartbeat_read, heartbeat_record

__all__ = [
    "ActionRefused",
    "CheckpointRow",
    "Claim",
    "Fenced",
    "Heartbeat",
    "StepState",
    "attempt_lost",
    "claim_blocker",
    "compensation_plan",
    "enqueue_grace",
    "event_add",
    "heartbeat_read",
    "heartbeat_record",
    "lease_renew",
    "outputs_load",
    "run_cancel",
    "run_create",
    "run_park",
    "run_resume",
    "run_retry",
    "state_load",
    "state_load_claiming",
    "step_claim",
    "step_complete",
    "step_fail",
    "unclaimed_complete",
]
