"""The only code that writes or locks engine rows: create, claim, complete, fail, advance, park,
delete.

Every claim and completion is a compare-and-set whose row count decides; nothing here calls a
partner. Step messages are published only from on-commit hooks.
"""

from __future__ import annotations

from agentflow.store.batches import (
    batch_begin,
    batch_fail,
    batch_keep_alive,
    batch_record,
    batch_republish,
    batch_started,
)
from agentflow.store.calls import (
    RecordedCall,
    ReplayedCall,
    calls_load,
    model_attempts,
    replay_load,
    run_fail_between_calls,
    run_finish,
    superseded_reusable,
    undone_call,
)
from agentflow.store.events import event_add
from agentflow.store.forks import Settled, fork_preview, live_calls, run_fork
from agentflow.store.operator import cancel_begin, run_cancel, run_resume, run_retry
from agentflow.store.retention import Deleted, runs_delete, runs_purge
from agentflow.store.runs import (
    ActionRefused,
    Fenced,
    attempt_lost,
    compensation_plan,
    enqueue_grace,
    outputs_load,
    run_create,
    run_park,
    step_fail,
)
from agentflow.store.sensitive import masked, sensitive_values
from agentflow.store.signals import Delivery, Replayed, signal_deliver, webhook_receipt_add
from agentflow.store.sql import databases_changed, server_setting
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
from agentflow.store.sweeps import (
    DueRun,
    Heartbeat,
    heartbeat_read,
    heartbeat_record,
    sweep_due,
    sweep_push,
    sweep_statements,
)
from agentflow.store.traces import trace_parent_record
from agentflow.store.waits import (
    PendingWait,
    call_digest,
    wait_decide,
    wait_pending,
    wait_settle,
)

__all__ = [
    "ActionRefused",
    "CheckpointRow",
    "Claim",
    "Deleted",
    "Delivery",
    "DueRun",
    "Fenced",
    "Heartbeat",
    "PendingWait",
    "RecordedCall",
    "Replayed",
    "ReplayedCall",
    "Settled",
    "StepState",
    "attempt_lost",
    "batch_begin",
    "batch_fail",
    "batch_keep_alive",
    "batch_record",
    "batch_republish",
    "batch_started",
    "call_digest",
    "calls_load",
    "cancel_begin",
    "claim_blocker",
    "compensation_plan",
    "databases_changed",
    "enqueue_grace",
    "event_add",
    "fork_preview",
    "heartbeat_read",
    "heartbeat_record",
    "lease_renew",
    "live_calls",
    "masked",
    "model_attempts",
    "outputs_load",
    "replay_load",
    "run_cancel",
    "run_create",
    "run_fail_between_calls",
    "run_finish",
    "run_fork",
    "run_park",
    "run_resume",
    "run_retry",
    "runs_delete",
    "runs_purge",
    "sensitive_values",
    "server_setting",
    "signal_deliver",
    "state_load",
    "state_load_claiming",
    "step_claim",
    "step_complete",
    "step_fail",
    "superseded_reusable",
    "sweep_due",
    "sweep_push",
    "sweep_statements",
    "trace_parent_record",
    "unclaimed_complete",
    "undone_call",
    "wait_decide",
    "wait_pending",
    "wait_settle",
    "webhook_receipt_add",
]
