"""The status vocabulary of runs and steps (docs/protocol.md, "Records"), shared by every layer."""

from __future__ import annotations

from django.db import models


class RunStatus(models.TextChoices):
    #: Created; its first step has not been claimed yet.
    PENDING = "PENDING", "Pending"
    #: A step is being worked on, or the next one is queued.
    RUNNING = "RUNNING", "Running"
    #: Backing off after a retryable error, or waiting for a timer, a signal or an approval
    #: (docs/workflows.md, "Timers, signals and approvals": its `RunWait` row says which); `wake_at`
    #: says when it is looked at again.
    WAITING = "WAITING", "Waiting"
    COMPLETED = "COMPLETED", "Completed"
    #: Failed permanently (after any compensation ran).
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"
    #: Parked for an operator: the engine will not guess (docs/protocol.md, "The key window").
    NEEDS_ATTENTION = "NEEDS_ATTENTION", "Needs attention"


class StepStatus(models.TextChoices):
    #: Claimed and committed before any side effect; the lease says who owns it.
    IN_PROGRESS = "IN_PROGRESS", "In progress"
    COMPLETED = "COMPLETED", "Completed"
    FAILED = "FAILED", "Failed"


class StepKind(models.TextChoices):
    #: No side effect: claim and completion fold into one commit.
    READ = "read", "read"
    #: Touches a partner: claim committed before, completion committed after.
    EFFECT = "effect", "effect"
    #: Writes only our own tables, in the same transaction as its checkpoint.
    DB = "db", "db"
    #: An LLM turn: checkpointed like an effect so its answer is replayed, never re-asked.
    LLM = "llm", "llm"


class WaitKind(models.TextChoices):
    """What a WAITING run waits for at its current position
    (docs/workflows.md, "Timers, signals and approvals")."""

    #: `ctx.sleep` / `Workflow.sleep`: a time, recorded when the run first got there.
    TIMER = "timer", "timer"
    #: `ctx.wait_for` / `Workflow.wait_for`: a named signal (`durable.signal`), or its timeout.
    SIGNAL = "signal", "signal"
    #: A call declared `requires_approval`: an operator's decision, or its timeout (reject).
    APPROVAL = "approval", "approval"


#: Kinds whose claim commits before the step runs (docs/protocol.md, "One step, in order").
CLAIMED_KINDS = (StepKind.EFFECT, StepKind.LLM)

ACTIVE_RUN_STATUSES = (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)
TERMINAL_RUN_STATUSES = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
