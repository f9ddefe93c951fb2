"""The only code that writes or locks engine rows: create, claim, complete, fail, advance, park,
delete.

Every claim and completion is a compare-and-set whose row count decides; nothing here calls a
partner. Step messages are published only from on-commit hooks.
"""

from __future__ import annotations

from agentflow.store.calls import (
    RecordedCall,
    ReplayedCall,
    calls_load,
    replay_load,
    run_fail_between_calls,
    run_finish,
    superseded_reusable,
    undone_call,
)
from agentflow.store.events import event_add
from agentflow.store.forks import Settled, fork_preview, live_calls, run_fork
from agentflow.store.operator import cancel_begin, run_cancel, run_resume, run_retry
from agentflow.store.partners import (
    NEUTRAL as PARTNER_NEUTRAL,
)
from agentflow.store.partners import (
    OK as PARTNER_OK,
)
from agentflow.store.partners import (
    RATE_LIMITED as PARTNER_RATE_LIMITED,
)
from agentflow.store.partners import (
    UNAVAILABLE as PARTNER_UNAVAILABLE,
)
from agentflow.store.partners import (
    PartnerView,
    Turn,
    TurnWait,
    partner_forget,
    partner_pause,
    partner_resume,
    partners_tick,
    partners_view,
    turn_return,
    turn_take,
    wait_gone,
)
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
from agentflow.store.turns import step_wait_turn
from agentflow.store.waits import (
    Delivery,
    PendingWait,
    call_digest,
    signal_deliver,
    wait_decide,
    wait_pending,
    wait_settle,
)

__all__ = [
    "PARTNER_NEUTRAL",
    "PARTNER_OK",
    "PARTNER_RATE_LIMITED",
    "PARTNER_UNAVAILABLE",
    "ActionRefused",
    "CheckpointRow",
    "Claim",
    "Deleted",
    "Delivery",
    "DueRun",
    "Fenced",
    "Heartbeat",
    "PartnerView",
    "PendingWait",
    "RecordedCall",
    "ReplayedCall",
    "Settled",
    "StepState",
    "Turn",
    "TurnWait",
    "attempt_lost",
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
    "outputs_load",
    "partner_forget",
    "partner_pause",
    "partner_resume",
    "partners_tick",
    "partners_view",
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
    "server_setting",
    "signal_deliver",
    "state_load",
    "state_load_claiming",
    "step_claim",
    "step_complete",
    "step_fail",
    "step_wait_turn",
    "superseded_reusable",
    "sweep_due",
    "sweep_push",
    "sweep_statements",
    "trace_parent_record",
    "turn_return",
    "turn_take",
    "unclaimed_complete",
    "undone_call",
    "wait_decide",
    "wait_gone",
    "wait_pending",
    "wait_settle",
]
