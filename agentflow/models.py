"""Engine tables: workflow runs, step checkpoints, run events. Fields and constraints only."""

from __future__ import annotations

import secrets

from django.db import models
from django.db.models import Q

from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus, StepKind, StepStatus, WaitKind
from agentflow._privacy.fields import SealedJSONField

# The keystore's tables (agentflow._privacy), registered with the engine's.
from agentflow._privacy.models import ErasureJournal, RunSubject, SubjectKey  # noqa: F401


def new_run_id() -> str:
    """128 random bits: the id is shown to customers, so it must be unguessable."""
    return f"wf_{secrets.token_hex(16)}"


class WorkflowRun(models.Model):
    id = models.CharField(primary_key=True, max_length=40, default=new_run_id, editable=False)
    workflow = models.CharField(max_length=100)
    version = models.PositiveIntegerField()
    input = SealedJSONField(default=dict, blank=True)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.PENDING)
    current_step = models.CharField(max_length=100, blank=True)
    current_seq = models.PositiveIntegerField(default=1)
    #: Agent runs: while calls run at once (`agentflow.agent.steps`), the last of their
    #: positions, `current_seq` being the first; `current_step` then says it in words, for
    #: people ("(calls 5-6 at once)"). NULL: no calls run at once.
    batch_last = models.PositiveIntegerField(null=True, blank=True)
    output = SealedJSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    business_key = models.CharField(max_length=200, null=True, blank=True)
    #: Compensation steps still to run, in order, once a permanent failure started undoing.
    compensations = models.JSONField(default=list, blank=True)
    #: An operator asked to cancel: the step in flight finishes, then the run undoes its
    #: effects and ends CANCELLED (not FAILED), so no money is kept (I8).
    cancel_requested = models.BooleanField(default=False, db_default=False)
    #: Agent runs: how many times an operator forked it. Steps of earlier branches are kept
    #: as superseded history; new calls get idempotency keys that name the branch.
    branch = models.PositiveIntegerField(default=0, db_default=0)
    #: The highest fence the checkpoints a fork set aside had: a checkpoint written after it
    #: starts above this, so no fence is used twice at a position and a worker still holding a
    #: set-aside claim matches nothing in the new branch (docs/protocol.md, "Operator actions").
    fence_floor = models.PositiveBigIntegerField(default=0, db_default=0)
    #: When the sweeper should look again if nothing moved: a lease expiry, a retry time,
    #: or an enqueue grace. NULL exactly when the run needs no sweeper (terminal or parked).
    wake_at = models.DateTimeField(null=True, blank=True)
    #: When the sweeper first re-published it without a worker writing it since (a write sets
    #: `updated_at`, which the sweeper leaves alone): while nobody answers, the gap to its next
    #: re-publish doubles from this (`agentflow._sweeps.backoff`). NULL: never rung.
    rung_at = models.DateTimeField(null=True, blank=True)
    #: The W3C traceparent its steps hang under when tracing is on (see agentflow._observe.tracing),
    #: so a step re-published without one (by the sweeper) stays in the run's trace.
    trace_parent = models.CharField(max_length=55, blank=True, db_default="")
    #: The build whose code runs it now (docs/deploys.md, "Builds"): the one it started on, until it
    #: moves to a newer one that can take it (`agentflow._builds.routing`). Empty: started before
    #: builds.
    build = models.CharField(max_length=100, blank=True, db_default="")
    #: The build it started on.
    started_build = models.CharField(max_length=100, blank=True, db_default="")
    #: It finishes on `build`: its workflow is declared `versioning="pinned"`, or a newer build
    #: found it could not take it. Its messages go to that build's own queue.
    pinned = models.BooleanField(default=False, db_default=False)
    #: Why its step may not start now, as `kind:key` (`build:<id>`: no live worker of the
    #: build it is pinned to); WAITING meanwhile, re-published when it may go. Empty: nothing.
    hold = models.CharField(max_length=200, blank=True, db_default="")
    #: The run whose step started it (a child run, docs/workflows.md "Runs that start runs"),
    #: and that step's position. No database constraint: retention deletes finished runs by
    #: id, and a parent may go before a child it left running.
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="children",
    )
    parent_seq = models.PositiveIntegerField(null=True, blank=True)
    #: 0-9, higher first: put on each of its step messages (agentflow._priority). Null: none.
    priority = models.PositiveSmallIntegerField(null=True, blank=True)
    #: The HMAC of its concurrency key (agentflow._concurrency), empty without one; with it,
    #: the cap it was started under.
    concurrency_key = models.CharField(max_length=64, blank=True, db_default="")
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        permissions = [
            ("approve_workflowrun", "Can approve or reject a call that waits for approval"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["workflow", "business_key"],
                condition=Q(business_key__isnull=False),
                name="run_unique_business_key",
            ),
            models.CheckConstraint(
                condition=Q(status__in=RunStatus.values), name="run_status_valid"
            ),
            # I7: an active run always has a wake-up time; a finished or parked one never does.
            models.CheckConstraint(
                condition=(
                    Q(status__in=ACTIVE_RUN_STATUSES, wake_at__isnull=False)
                    | (~Q(status__in=ACTIVE_RUN_STATUSES) & Q(wake_at__isnull=True))
                ),
                name="run_wake_at_iff_active",
            ),
        ]
        indexes = [
            # Exactly the sweeper's query: its cost follows active runs, not history.
            models.Index(
                fields=["wake_at"],
                condition=Q(status__in=ACTIVE_RUN_STATUSES),
                name="run_sweep_due",
            ),
            # Parked runs for the operator dashboard. Partial, and not on updated_at, so the
            # updates of every other step leave it alone (and can be HOT updates).
            models.Index(
                fields=["-created_at"],
                condition=Q(status=RunStatus.NEEDS_ATTENTION),
                name="run_needs_attention",
            ),
            models.Index(fields=["-created_at"], name="run_created"),
            # Held runs, by what holds them: a release reads exactly these.
            models.Index(fields=["hold"], condition=~Q(hold=""), name="run_held"),
            # A parent's children, by the step that started them: what its wait counts.
            models.Index(
                fields=["parent", "parent_seq", "status"],
                condition=Q(parent__isnull=False),
                name="run_children",
            ),
            # A key's runs, oldest first: what its admission counts and whom it admits next.
            models.Index(
                fields=["concurrency_key", "created_at"],
                condition=~Q(concurrency_key=""),
                name="run_concurrency_key",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.workflow} {self.id}"


class ConcurrencyKey(models.Model):
    """A concurrency key with runs not yet finished: the row its admissions lock, so that
    counting the key's admitted runs and admitting one more is one decision on every host.
    Deleted with its last run's end."""

    digest = models.CharField(primary_key=True, max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"concurrency key {self.digest[:12]}"


class StepCheckpoint(models.Model):
    # No separate index: the (run, seq) unique constraint leads with run.
    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="steps", db_index=False
    )
    seq = models.PositiveIntegerField()
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=StepKind.choices)
    status = models.CharField(max_length=20, choices=StepStatus.choices)
    #: The retry budget used: attempts since the last operator retry (which resets it).
    attempts = models.PositiveIntegerField(default=1)
    #: Grows by one with every claim, takeover and operator action on this checkpoint and is
    #: never reset: every write of a worker is fenced on the number its claim got
    #: (docs/protocol.md, "One step, in order").
    fence = models.PositiveBigIntegerField(default=1, db_default=1)
    idempotency_key = models.CharField(max_length=120)
    arguments = SealedJSONField(null=True, blank=True)
    #: An agent call's fingerprint digest (also in `arguments`), in a column of its own: the one
    #: value of the call a replay reads, so it never loads the call's arguments (a model turn's
    #: messages). Empty for graph steps and for calls recorded before the column.
    digest = models.CharField(max_length=64, blank=True, db_default="")
    #: The build whose code ran (claimed or completed) it last (docs/deploys.md, "Builds").
    build = models.CharField(max_length=100, blank=True, db_default="")
    output = SealedJSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    #: For FAILED: may another attempt run under the same key?
    retryable = models.BooleanField(default=False)
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    #: The owner process's advisory lock (docs/protocol.md, "Liveness"): free means the owner is
    #: gone, on any host. NULL when the owner holds none (SQLite, or its liveness connection was
    #: down): lease only.
    lease_lock = models.BigIntegerField(null=True, blank=True)
    #: The database server that lock was held on (system identifier / timeline): a free lock
    #: says the owner is gone only on that same server, not on a promoted standby or a copy.
    lease_server = models.CharField(max_length=40, blank=True, db_default="")
    #: For a retryable FAILED attempt: the earliest database time the next one may be claimed.
    retry_at = models.DateTimeField(null=True, blank=True)
    #: When the first attempt began: the partner-key age guard measures from here.
    first_started_at = models.DateTimeField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run_id", "seq"]  # "run" would join the run table to order by its ordering
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="step_unique_run_seq"),
            models.UniqueConstraint(fields=["idempotency_key"], name="step_unique_key"),
            models.CheckConstraint(
                condition=Q(status__in=StepStatus.values), name="step_status_valid"
            ),
            models.CheckConstraint(condition=Q(kind__in=StepKind.values), name="step_kind_valid"),
            models.CheckConstraint(
                condition=~Q(status=StepStatus.IN_PROGRESS) | Q(lease_expires_at__isnull=False),
                name="step_in_progress_has_lease",
            ),
            models.CheckConstraint(
                condition=~Q(status=StepStatus.COMPLETED) | Q(finished_at__isnull=False),
                name="step_completed_has_finish",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.seq} {self.name}"


class RunEvent(models.Model):
    """Append-only: what happened to a run that is not a step (I6)."""

    class Kind(models.TextChoices):
        SWEEP_REQUEUE = "sweep_requeue", "Re-enqueued by the sweeper"
        OPERATOR_RETRY = "operator_retry", "Retried by an operator"
        OPERATOR_CANCEL = "operator_cancel", "Cancelled by an operator"
        VERSION_MISMATCH = "version_mismatch", "Definition version changed"
        NEEDS_ATTENTION = "needs_attention", "Parked for an operator"
        OPERATOR_RESUME = "operator_resume", "Resumed now by an operator"
        COMPENSATION = "compensation", "Compensation started"
        RECONCILED = "reconciled", "Outcome adopted from the partner"
        #: A step's attempt failed and another will run (its times and error are in `data`).
        ATTEMPT_FAILED = "attempt_failed", "Attempt failed"
        #: A checkpoint left IN_PROGRESS by a lost owner was claimed by another worker.
        TAKEOVER = "takeover", "Taken over from a lost owner"
        #: An effect may or may not have happened and nothing could tell: parked for a human.
        OUTCOME_UNKNOWN = "outcome_unknown", "Outcome unknown"
        #: A fenced-out worker finished anyway: its output is kept here for audit.
        LATE_COMPLETION = "late_completion", "Late completion fenced out"
        #: An agent run made another call than the one recorded at a position (the diff).
        DIVERGENCE = "divergence", "Diverged from its recorded history"
        #: An operator forked an agent run from a position; later steps were superseded.
        FORK = "fork", "Forked by an operator"
        #: The run began to wait for a timer, a signal or an approval (the wait's row says which).
        WAITING = "waiting", "Waiting"
        #: A signal was delivered to the wait at its position (`data`: its id and name).
        SIGNAL = "signal", "Signal received"
        OPERATOR_APPROVE = "operator_approve", "Approved by an operator"
        OPERATOR_REJECT = "operator_reject", "Rejected by an operator"
        #: A signal's or an approval's timeout passed first (an approval's: the reject path).
        WAIT_TIMED_OUT = "wait_timed_out", "Wait timed out"
        #: A newer build took the run by rule (docs/deploys.md, "Builds"): `data` has both builds
        #: and versions.
        UPGRADED = "upgraded", "Moved to a newer build"
        #: A newer build could not take it: it finishes on its own build (`data`: the diff).
        PINNED = "pinned", "Stays on its build"
        #: Its step may not start now (no live worker of its build): WAITING with the reason.
        HELD = "held", "Waiting to start"
        #: What held it is gone (a worker of its build started): published again.
        RELEASED = "released", "Released"
        #: An operator moved it to the current build, after the same check.
        OPERATOR_MOVE = "operator_move", "Moved to the current build by an operator"

    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="events", db_index=False
    )
    at = models.DateTimeField(auto_now_add=True)
    kind = models.CharField(max_length=30, choices=Kind.choices)
    actor = models.CharField(max_length=150, blank=True)
    detail = models.TextField(blank=True)
    #: The step the event is about, if any.
    seq = models.PositiveIntegerField(null=True, blank=True)
    #: Structured facts (attempt, fence, times, owner, output) for the timeline and audits.
    data = SealedJSONField(null=True, blank=True)

    class Meta:
        ordering = ["run_id", "at", "id"]
        indexes = [models.Index(fields=["run", "at"], name="event_run_at")]

    def __str__(self) -> str:
        return f"{self.run_id} {self.kind}"


class SupersededStep(models.Model):
    """A checkpoint of an agent run that an operator's fork set aside: history, still shown,
    never replayed. A call the new branch makes again with the same arguments reuses its
    result and key instead of acting twice."""

    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="superseded", db_index=False
    )
    #: The branch it belonged to (the run's branch before the fork).
    branch = models.PositiveIntegerField()
    seq = models.PositiveIntegerField()
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=10, choices=StepKind.choices)
    status = models.CharField(max_length=20, choices=StepStatus.choices)
    attempts = models.PositiveIntegerField()
    idempotency_key = models.CharField(max_length=120)
    arguments = SealedJSONField(null=True, blank=True)
    output = SealedJSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    superseded_at = models.DateTimeField()

    class Meta:
        ordering = ["run_id", "branch", "seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "branch", "seq"], name="superseded_unique_run_branch_seq"
            )
        ]

    def __str__(self) -> str:
        return f"{self.run_id} branch {self.branch} #{self.seq} {self.name}"


class RunWait(models.Model):
    """Where a run waits (docs/workflows.md, "Timers, signals and approvals"): a timer, a signal or
    an approval, at one position of one branch. Recorded when the run first gets there, resolved
    once (the signal's payload, the operator's decision, a timeout), and read back by every replay
    of that position."""

    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="waits", db_index=False
    )
    branch = models.PositiveIntegerField()
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=WaitKind.choices)
    #: The signal's name; the call's name (step or tool) for an approval; a timer's step.
    name = models.CharField(max_length=200)
    #: An approval: the call's canonical arguments (what the operator sees and decides on).
    arguments = SealedJSONField(null=True, blank=True)
    #: An approval: SHA-256 of the canonical (name, arguments); a decision is reused only for
    #: a call with the same digest.
    digest = models.CharField(max_length=64, blank=True)
    requested_at = models.DateTimeField()
    #: A timer's time; a signal's or an approval's timeout. NULL: a signal without a timeout.
    deadline = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    #: What the waiting step reads: `{"woke_at"}`, `{"payload"}` / `{"timed_out": true}`, or
    #: the decision (`{"approved", "actor", "reason", "timed_out"}`).
    outcome = SealedJSONField(null=True, blank=True)
    #: Who resolved it ("engine" for a timer or a timeout) and why.
    actor = models.CharField(max_length=150, blank=True)
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["run_id", "branch", "seq"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "branch", "seq"], name="wait_unique_run_branch_seq"
            ),
            models.CheckConstraint(condition=Q(kind__in=WaitKind.values), name="wait_kind_valid"),
            models.CheckConstraint(
                condition=Q(resolved_at__isnull=True) | Q(outcome__isnull=False),
                name="wait_resolved_has_outcome",
            ),
        ]
        indexes = [
            # The dashboard's and the gauge's "waiting for approval": cost follows open waits.
            models.Index(
                fields=["requested_at"],
                condition=Q(resolved_at__isnull=True),
                name="wait_open",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.seq} {self.kind} {self.name}"


class RunSignal(models.Model):
    """A signal sent to a run, once per `signal_id` (the unique constraint is the exactly-once:
    a repeated id is acknowledged and changes nothing). Kept from the moment it arrives, whether
    or not the run waits for it yet; a `wait_for` of its name consumes the oldest one kept (in
    `id` order, the order they arrived in), once."""

    run = models.ForeignKey(
        WorkflowRun, on_delete=models.CASCADE, related_name="signals", db_index=False
    )
    signal_id = models.CharField(max_length=200)
    name = models.CharField(max_length=200)
    payload = SealedJSONField(null=True, blank=True)
    #: The wait that consumed it (NULL while it is kept, waiting for one).
    branch = models.PositiveIntegerField(null=True, blank=True)
    seq = models.PositiveIntegerField(null=True, blank=True)
    received_at = models.DateTimeField()
    #: When that wait consumed it, in the transaction that resolved the wait.
    consumed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run_id", "id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "signal_id"], name="signal_unique_run_id"),
            # Consumed means consumed by one wait, named; kept means by none.
            models.CheckConstraint(
                condition=(
                    Q(consumed_at__isnull=True, branch__isnull=True, seq__isnull=True)
                    | Q(consumed_at__isnull=False, branch__isnull=False, seq__isnull=False)
                ),
                name="signal_consumed_by_one_wait",
            ),
            # A wait consumes one signal, never two.
            models.UniqueConstraint(
                fields=["run", "branch", "seq"],
                condition=Q(consumed_at__isnull=False),
                name="signal_one_per_wait",
            ),
        ]
        indexes = [
            # A wait's question, "the oldest kept signal of this name": cost follows kept ones.
            models.Index(
                fields=["run", "name", "id"],
                condition=Q(consumed_at__isnull=True),
                name="signal_kept",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} signal {self.name} ({self.signal_id})"


class WebhookReceipt(models.Model):
    """A signed partner webhook accepted (`agentflow.webhooks`), kept while its timestamp is
    inside the tolerance: the same signed request sent again is refused as a replay, where a
    partner's own repeated delivery (signed afresh) acts once by its signal id."""

    #: The partner whose secret verified it (the URL's, and a key of AGENTFLOW_WEBHOOK_SECRETS).
    partner = models.CharField(max_length=100)
    #: SHA-256 of what was signed: "timestamp.body".
    digest = models.CharField(max_length=64)
    #: The timestamp the partner signed; rows older than the tolerance are pruned.
    signed_at = models.DateTimeField()
    received_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["partner", "digest"], name="webhook_receipt_once")
        ]
        indexes = [models.Index(fields=["signed_at"], name="webhook_receipt_signed")]

    def __str__(self) -> str:
        return f"{self.partner} webhook {self.digest[:12]}"


class SweeperHeartbeat(models.Model):
    """When the recovery sweeper last ran (one row per sweeper name): recovery stands on it, so
    /healthz, /metrics and the admin dashboard watch its age."""

    name = models.CharField(primary_key=True, max_length=50)
    #: Database time of the last completed sweep.
    swept_at = models.DateTimeField()
    requeued = models.PositiveIntegerField(default=0)
    query_ms = models.FloatField(default=0.0)

    def __str__(self) -> str:
        return f"{self.name} at {self.swept_at}"


class Build(models.Model):
    """A build (docs/deploys.md, "Builds"): the code a process runs, named by AGENTFLOW_BUILD_ID or
    a digest of its definitions. Recorded by the first process of it that starts a run or a
    worker."""

    id = models.CharField(primary_key=True, max_length=100)
    #: What it registers (each workflow's version, steps, kinds, compensations): what a newer
    #: build compares a run of it against, and what `agentflow_builds` shows.
    definitions = models.JSONField(default=dict, blank=True)
    #: Database time. Orders builds: a run never moves to a build first seen before its own.
    first_seen_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()

    class Meta:
        ordering = ["-first_seen_at"]

    def __str__(self) -> str:
        return self.id


class BuildWorker(models.Model):
    """A live worker process of a build (its main process): a heartbeat, and on Postgres an
    advisory lock whose release says at once that it died (docs/protocol.md, "Liveness")."""

    name = models.CharField(primary_key=True, max_length=200)
    build = models.CharField(max_length=100)
    #: The build's own queue it consumes, besides the shared one.
    queue = models.CharField(max_length=200)
    started_at = models.DateTimeField()
    #: Database time of its latest heartbeat.
    seen_at = models.DateTimeField()
    #: Its liveness lock (None: leases alone, e.g. SQLite) and the server it is held on.
    lock = models.BigIntegerField(null=True, blank=True)
    lock_server = models.CharField(max_length=40, blank=True)

    class Meta:
        ordering = ["build", "name"]
        indexes = [models.Index(fields=["build"], name="build_worker_build")]

    def __str__(self) -> str:
        return f"{self.name} ({self.build})"


class PartnerState(models.Model):
    """One limited partner's shared state (docs/partner-limits.md, "What happens"): its key's next
    free turn, how a 429 slowed it, its breaker, an operator's pause. Created on the partner's first
    call; every worker on every host takes its turns under this row's lock. Times are the database's
    clock in epoch seconds: the limiter's arithmetic, without time zones."""

    partner = models.CharField(primary_key=True, max_length=100)
    #: The next turn the rate gives (GCRA's theoretical arrival time): turns are handed out in
    #: arrival order, one interval apart, and a turn reserved is kept for its step. Like the
    #: reserved turns (`PartnerWaiter.go_at`), on the key's schedule: add `turn_shift`.
    next_turn_at = models.FloatField(default=0.0)
    #: The earliest the next call may actually go: one interval after the last turn given.
    #: Every turn given waits for this, so calls never go closer than an interval.
    spent_until = models.FloatField(default=0.0)
    #: How far the schedule has moved back: a turn whose step was not there when it came went
    #: to a step that was, and every reserved turn moved back to make room (none is lost).
    turn_shift = models.FloatField(default=0.0)
    #: Turns given and 429s in this second (from `window_at`) and the one before: what the
    #: partner accepts, learned on a 429.
    window_at = models.FloatField(default=0.0)
    window_given = models.PositiveIntegerField(default=0)
    window_refused = models.PositiveIntegerField(default=0)
    prior_given = models.PositiveIntegerField(default=0)
    prior_refused = models.PositiveIntegerField(default=0)
    #: A 429's Retry-After (or the partner's window reset): no call before this.
    blocked_until = models.FloatField(default=0.0)
    #: The key's speed climbs from `speed_floor` (its share of the limit) at `speed_since`.
    speed_floor = models.FloatField(default=1.0)
    speed_since = models.FloatField(default=0.0)
    #: ... and no higher than this share for a while: the partner's limit, learned from a 429.
    speed_ceiling = models.FloatField(default=1.0)
    breaker = models.CharField(max_length=10, default="closed")
    #: Consecutive timeouts, 5xx or connection errors.
    failures = models.PositiveIntegerField(default=0)
    #: Times opened (or a probe refused) since it last closed: each doubles the cool-down.
    opened_times = models.PositiveIntegerField(default=0)
    #: Open: when the next probe may go. Half open: the probe's lease.
    probe_at = models.FloatField(default=0.0)
    paused = models.BooleanField(default=False)
    pause_reason = models.TextField(blank=True)
    paused_by = models.CharField(max_length=150, blank=True)
    rate_limited_total = models.PositiveBigIntegerField(default=0)
    last_rate_limited_at = models.FloatField(null=True, blank=True)
    last_rate_limited_reason = models.CharField(max_length=100, blank=True)
    errors_total = models.PositiveBigIntegerField(default=0)
    last_error_at = models.FloatField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["partner"]
        permissions = [
            ("pause_partnerstate", "Can pause and resume calls to a partner"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(breaker__in=["closed", "open", "half_open"]),
                name="partner_breaker_valid",
            ),
        ]

    def __str__(self) -> str:
        return self.partner


class PartnerSlot(models.Model):
    """A call to a limited partner in flight: its place under the partner's concurrency limit.
    Held on a lease with the owner process's liveness lock (docs/protocol.md, "Liveness"), so a
    worker killed mid-call frees it as soon as its process is gone, or when the lease runs out."""

    partner = models.CharField(max_length=100)
    run_id = models.CharField(max_length=40, blank=True)
    seq = models.PositiveIntegerField(null=True, blank=True)
    #: The breaker's probe: its answer closes or reopens the breaker.
    probe = models.BooleanField(default=False)
    lease_expires_at = models.FloatField()
    lease_lock = models.BigIntegerField(null=True, blank=True)
    lease_server = models.CharField(max_length=40, blank=True, db_default="")
    started_at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["partner", "lease_expires_at"], name="partner_slot_live")]

    def __str__(self) -> str:
        return f"{self.partner} call of {self.run_id} #{self.seq}"


class PartnerWaiter(models.Model):
    """A step waiting for its turn at a partner, in arrival order (`id`). With `go_at` its turn
    is given (a reserved rate turn, a freed place, a resume): it goes then, ahead of anyone
    who arrived after it; without, it waits for a place, the breaker or the operator."""

    id = models.BigAutoField(primary_key=True)
    partner = models.CharField(max_length=100)
    run_id = models.CharField(max_length=40)
    seq = models.PositiveIntegerField()
    #: "rate limit", "concurrency", "breaker open", "paused": what the run says it waits for.
    reason = models.CharField(max_length=40)
    #: A freed place's: when it was handed over. A reserved rate turn's or a resume's: on the
    #: key's schedule (its time is this plus `PartnerState.turn_shift`).
    go_at = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(
                fields=["partner", "run_id", "seq"], name="partner_waiter_unique_step"
            )
        ]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.seq} waits for {self.partner}: {self.reason}"


class PartnerEvent(models.Model):
    """What happened to a partner (append-only): a 429, an error, the breaker opening or
    closing, an operator's pause or resume with actor and reason (I6)."""

    class Kind(models.TextChoices):
        RATE_LIMITED = "rate_limited", "Rate limited (429)"
        ERROR = "error", "Timeout, 5xx or connection error"
        BREAKER_OPEN = "breaker_open", "Breaker opened"
        BREAKER_CLOSED = "breaker_closed", "Breaker closed"
        PAUSED = "paused", "Paused by an operator"
        RESUMED = "resumed", "Resumed by an operator"

    partner = models.CharField(max_length=100)
    at = models.DateTimeField(auto_now_add=True)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    actor = models.CharField(max_length=150, blank=True)
    detail = models.TextField(blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["partner", "-at"], name="partner_event_recent")]

    def __str__(self) -> str:
        return f"{self.partner} {self.kind} at {self.at}"


class ScheduleState(models.Model):
    """What operators change about a schedule declared in code, without a deploy
    (docs/schedules.md): paused or not, its cron and input overrides; and how far its slots have
    been acted on. One row per declared schedule, made by the first tick that sees it."""

    name = models.CharField(max_length=200, primary_key=True)
    #: Slots after this (by the schedule's clock) are its own: a schedule never backfills the
    #: time before it was first seen.
    since = models.DateTimeField()
    #: The latest slot acted on (started, queued or skipped); the next tick goes on from there.
    last_slot = models.DateTimeField(null=True, blank=True)
    #: When the run of the latest started slot was started (the schedule's clock).
    last_started_at = models.DateTimeField(null=True, blank=True)
    paused = models.BooleanField(default=False)
    pause_reason = models.TextField(blank=True)
    paused_by = models.CharField(max_length=150, blank=True)
    #: Overrides of the declaration (empty / null: as declared in code or settings).
    cron = models.CharField(max_length=200, blank=True)
    input = models.JSONField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        permissions = [
            ("pause_schedulestate", "Can pause and resume a schedule"),
            ("trigger_schedulestate", "Can start one slot of a schedule by hand"),
        ]

    def __str__(self) -> str:
        return self.name


class ScheduleSlot(models.Model):
    """What became of one slot of a schedule (docs/schedules.md): the run it started, queued
    behind the previous one, or skipped and why. Unique per (schedule, slot): a slot is acted
    on once, whichever process saw it first."""

    class Outcome(models.TextChoices):
        STARTED = "started", "Started"
        QUEUED = "queued", "Queued behind the previous slot's run"
        SKIPPED = "skipped", "Skipped"

    class Why(models.TextChoices):
        CRON = "cron", "Its time came"
        BY_HAND = "by_hand", "Started by hand"
        MISSED = "missed", "Missed, older than the catch-up window"
        OVERLAP = "overlap", "The previous slot's run had not finished"
        PAUSED = "paused", "The schedule was paused"

    id = models.BigAutoField(primary_key=True)
    schedule = models.CharField(max_length=200)
    slot = models.DateTimeField()
    outcome = models.CharField(max_length=10, choices=Outcome.choices)
    why = models.CharField(max_length=10, choices=Why.choices)
    run_id = models.CharField(max_length=40, blank=True)
    reason = models.TextField(blank=True)
    actor = models.CharField(max_length=150, blank=True)
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-slot"]
        constraints = [
            models.UniqueConstraint(fields=["schedule", "slot"], name="schedule_slot_once"),
            models.CheckConstraint(
                condition=Q(outcome__in=["started", "queued", "skipped"]),
                name="schedule_slot_outcome_valid",
            ),
            models.CheckConstraint(
                condition=~Q(outcome="started") | ~Q(run_id=""),
                name="schedule_slot_started_has_run",
            ),
        ]
        indexes = [models.Index(fields=["schedule", "-slot"], name="schedule_slot_recent")]

    def __str__(self) -> str:
        return f"{self.schedule} {self.slot:%Y-%m-%d %H:%M} {self.outcome}"
