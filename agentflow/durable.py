"""The engine's public API: define workflows, start runs, read their progress.

Domain apps import only this module::

    from agentflow import durable

    rebooking = durable.Workflow("rebooking", version=1)

    @rebooking.step("charge_customer", kind="effect", compensate="refund_fee")
    def charge_customer(ctx: durable.StepContext) -> dict: ...

    run_id = durable.start("rebooking", input={...}, business_key="request-42")

    # A run at each slot, exactly once per slot (docs/schedules.md).
    durable.Schedule(name="nightly_rebookings", workflow="rebooking", cron="0 2 * * *")
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from types import EllipsisType
from typing import Any

from django.db import transaction

from agentflow import _children, _concurrency, _priority
from agentflow import _store as store
from agentflow._base import outcomes
from agentflow._base.context import Decision, StepContext, UndoneCall, idempotency_key
from agentflow._base.retry import RetryPolicy
from agentflow._base.states import TERMINAL_RUN_STATUSES, RunStatus, StepKind, StepStatus, WaitKind
from agentflow._builds import routing
from agentflow._conf import settings
from agentflow._core import registry
from agentflow._core.links import Link, RunRef, StepRef
from agentflow._core.links import register as register_links
from agentflow._core.registry import END, Workflow
from agentflow._core.replies import REPLY_MAX_CHARS, Replies
from agentflow._core.sensitive import Sensitive
from agentflow._core.serialization import NotJSONError, storable_text, to_json
from agentflow._engine import forks
from agentflow._limits import limiter
from agentflow._observe import telemetry
from agentflow._personal_fields import PersonalTextField, personal_keys
from agentflow._privacy import envelope, keystore
from agentflow._privacy import scope as privacy
from agentflow._privacy.personal import Personal
from agentflow._schedules import Schedule
from agentflow.agent.loop import AgentContext, CodeWorkflow
from agentflow.agent.waiting import Waited
from agentflow.exceptions import (
    ActionRefused,
    AgentflowError,
    AnswerLost,
    DefinitionError,
    InvalidInputError,
    NeedsAttention,
    OutcomeUnknown,
    PartnerRateLimited,
    PartnerUnavailable,
    PermanentStepError,
    RetryableStepError,
    ScheduleError,
    UnknownWorkflowError,
)
from agentflow.models import WorkflowRun

#: How the reason of a step waiting for its turn at a partner begins (`PartnerWait`).
PARTNER_WAIT_PREFIX = "waiting for "
#: What `signal` answers: "delivered" (consumed, or kept for a later `wait_for`), or
#: "duplicate" for a `signal_id` seen before.
Delivery = store.Delivery

__all__ = [
    "END",
    "ActionRefused",
    "AgentContext",
    "AgentflowError",
    "AnswerLost",
    "CodeWorkflow",
    "Decision",
    "Delivery",
    "InvalidInputError",
    "Link",
    "NeedsAttention",
    "OutcomeUnknown",
    "PartnerRateLimited",
    "PartnerUnavailable",
    "PermanentStepError",
    "Personal",
    "PersonalTextField",
    "Replies",
    "RetryPolicy",
    "RetryableStepError",
    "RunRef",
    "RunSnapshot",
    "RunStatus",
    "Schedule",
    "ScheduleError",
    "Sensitive",
    "StepContext",
    "StepKind",
    "StepRef",
    "StepSnapshot",
    "StepStatus",
    "UndoneCall",
    "UnknownWorkflowError",
    "WaitKind",
    "Waited",
    "Workflow",
    "approve",
    "cancel",
    "cancel_children",
    "delete_runs",
    "fork",
    "idempotency_key",
    "may_have_happened",
    "partner_call",
    "personal_keys",
    "register_links",
    "reject",
    "retry",
    "seal_personal",
    "signal",
    "snapshot",
    "start",
    "start_children",
    "start_many",
    "started_children",
    "wait_for_children",
    "workflow_steps",
]


def start(
    workflow: str,
    *,
    input: Any = None,
    business_key: str | None = None,
    priority: int | None = None,
) -> str:
    """Start a run of the latest version of `workflow` and return its id.

    Idempotent on `business_key`: the same key returns the same run. Call it inside your own
    transaction to create the run atomically with your rows; the first step is published only
    when that transaction commits. `priority` (0-9, higher first): this run's, instead of the
    workflow's (docs/workflows.md, "Priorities"). A workflow with a `concurrency_key` over its
    cap for the run's key creates the run WAITING; it starts when its turn comes.

    Raises:
        UnknownWorkflowError: no workflow of that name is registered.
        InvalidInputError: `input` cannot be stored as JSON, `business_key` is not text
            of 1-200 characters, `priority` is not 0-9, or the workflow's concurrency key
            cannot be read from `input`.
    """
    definition = registry.latest(workflow)
    definition.validate()
    if business_key is not None and not _stored_text(business_key, 200):
        raise InvalidInputError("a business key is text of 1-200 characters, without NUL")
    chosen = _priority.given(priority)
    if chosen is None:
        chosen = definition.priority
    if chosen is None:
        chosen = settings.AGENTFLOW_DEFAULT_PRIORITY
    try:
        payload = to_json({} if input is None else input, "workflow input")
    except NotJSONError as exc:
        raise InvalidInputError(str(exc)) from None
    digest = ""
    if definition.concurrency_key is not None:
        key = _concurrency.key_of(definition.name, definition.concurrency_key, payload)
        digest = _concurrency.digest(definition.name, key)
    if definition.personal is None:
        run_id, created = store.run_create(
            workflow=definition,
            input=payload,
            business_key=business_key,
            priority=chosen,
            concurrency_key=digest,
        )
    else:
        run_id, created = _start_personal(
            definition, payload, business_key, priority=chosen, concurrency_key=digest
        )
    if created:
        telemetry.run_started(run_id, definition.name, keep_trace=store.trace_parent_record)
    return run_id


def _start_personal(
    definition: Workflow,
    payload: Any,
    business_key: str | None,
    *,
    priority: int | None,
    concurrency_key: str,
) -> tuple[str, bool]:
    """A run whose workflow declares personal fields (docs/privacy.md): its rows sealed under
    its subject's key from the first, and bound to that key in the run's own commit."""
    personal = definition.personal
    assert personal is not None
    if not keystore.enabled():
        return store.run_create(
            workflow=definition,
            input=payload,
            business_key=business_key,
            priority=priority,
            concurrency_key=concurrency_key,
        )
    try:
        subject = personal.subject_of(payload)
    except DefinitionError as exc:
        raise InvalidInputError(str(exc)) from None
    with transaction.atomic():
        key_id = store.subject_key_for(subject)
        with privacy.sealing(key_id, personal.fields):
            run_id, created = store.run_create(
                workflow=definition,
                input=payload,
                business_key=business_key,
                priority=priority,
                concurrency_key=concurrency_key,
            )
            if created:
                store.run_subject_bind(run_id, key_id, personal.names())
    return run_id, created


def start_children(
    ctx: StepContext | AgentContext,
    children: Iterable[tuple[str, Any, str | None]],
    *,
    compensate: str | EllipsisType | None = ...,
    priority: int | None = None,
) -> list[str]:
    """From a step, or from an agent workflow's function: start a child run for each
    (workflow, input, key) and return their ids in order (docs/workflows.md, "Runs that start
    runs").

    Each child's business key is `<this run>:<this step's position>:<key>` (its index when
    `key` is None): the step run again starts none twice and gets the same ids. In the caller's
    transaction if there is one; published once it commits. In an agent workflow the start is
    a call of its own, replayed from its record like any other. `priority` and concurrency
    keys: as `start_many`.

    What happens to the children if the parent fails for good or is cancelled is the
    parent's to say. A graph step says it in its declaration (`compensate=` naming a
    compensation declared with `cancel_children`, or none). An agent workflow's function says
    it here, and must: `compensate="cancel_kids"` names a compensation its workflow declares
    (`agent.compensation("cancel_kids")(durable.cancel_children)`), which cancels the
    children this call started, each undoing what it did; `compensate=None` leaves them to
    finish. The call's record keeps the choice.

    Raises:
        UnknownWorkflowError, InvalidInputError: as `start_many`; nothing is started.
        DefinitionError: an agent run's call without `compensate`, or naming a compensation
            its workflow does not declare; a graph step's call with one.
    """
    return _children.start_children(ctx, children, compensate=compensate, priority=priority)


def started_children(ctx: StepContext) -> list[str]:
    """The children the current step started (empty: none yet), in order: what the step's
    reconcile adopts when its worker died after starting them."""
    return _children.started_children(ctx)


def wait_for_children(
    workflow: Workflow | AgentContext, name: str = "", *, wait: str = "all", next: Any = None
) -> Any:
    """Declare step `name` of `workflow`: wait for the children the latest earlier step
    started, "all" of them or the "first" to end, WAITING meanwhile and holding no worker. Its
    output is `{"payload": {"wait", "counts", "children"}}`: the counts by status and each child
    that ended (`run_id`, `workflow`, `business_key`, `status`, `error`; for "first", its
    `output` too). A failed child does not fail the parent: the report says so.

    In an agent workflow's function, call it with the context instead
    (`durable.wait_for_children(ctx, wait="all")`): the same wait, for the children of its
    latest earlier `start_children`, which returns the report itself."""
    return _children.wait_for_children(workflow, name, wait=wait, next=next)


#: A compensation to declare for the step, or name from the agent call, that starts children
#: (docs/workflows.md, "Runs that start runs"): the parent failed for good or cancelled
#: cancels each unfinished child that start made.
cancel_children = _children.cancel_children


def seal_personal(values: Iterable[tuple[str, Any]]) -> list[Any]:
    """Each (subject, value) as `value` sealed under that subject's key, in order: what a run
    holding many people's details (a flight's passengers), and so declaring no one subject,
    returns for each person's own fields (docs/privacy.md). Kept in any of a run's JSON, it
    opens as it is read, "erased" once its subject was erased. The subjects' keys are read or
    made together; without a master key, the values as given."""
    pairs = list(values)
    if not pairs or not keystore.enabled():
        return [value for _, value in pairs]
    keys = store.subject_keys_for_many(subject.strip() for subject, _ in pairs)
    return [envelope.seal_value(keys[subject.strip()], value) for subject, value in pairs]


def start_many(
    runs: Iterable[tuple[str, Any, str | None]], *, priority: int | None = None
) -> list[str]:
    """Start a run for each (workflow, input, business key) and return their ids in order.

    One INSERT per thousand runs (plus one read of the keyed ones' ids), in the caller's
    transaction like `start`; each first step is published when that transaction commits.
    Idempotent on business keys: a key seen before returns its run and starts nothing.
    `priority` (0-9, higher first): every one of these runs', instead of its workflow's. A
    workflow with a `concurrency_key` admits its runs as `start` does, all of them together
    (two more statements per thousand): those over the cap are created WAITING, behind the
    ones before them.

    Raises:
        UnknownWorkflowError: a workflow name that is not registered.
        InvalidInputError: an entry that is not a triple, an input that cannot be stored as
            JSON, a business key that is not text of 1-200 characters, `priority` is not 0-9,
            or a workflow's concurrency key cannot be read from an input. Nothing is started.
    """
    return _children.start_many(runs, priority=priority)


def partner_call(partner: str, operation: str) -> AbstractContextManager[None]:
    """Wrap one request to a partner (each retry its own), around the code that turns its
    errors into ours::

        with durable.partner_call("stripe", "charge"), _stripe_errors("charge"):
            intent = client.v1.payment_intents.create(...)

    For a partner named in AGENTFLOW_PARTNER_LIMITS it first takes the request's turn, for the
    whole fleet: without one, the step waits (its run WAITING, "waiting for stripe: rate
    limit"; no worker held, no attempt spent) and runs again when its turn comes. Raise
    `PartnerRateLimited` for the partner's 429 (its key slows for every run; the step waits,
    as the partner did not act) and `PartnerUnavailable` for a timeout, 5xx or connection
    error (they open the partner's breaker). It traces the call (a span with the step's run
    id, step and idempotency key) and counts the errors it raises by partner and kind.
    """
    return limiter.partner_call(partner, operation)


def fork(run_id: str, *, position: int, actor: str, reason: str) -> None:
    """Continue a diverged, parked or failed agent run from `position` on a new branch
    (see `store.run_fork`).

    Raises:
        ActionRefused: not an agent run, not stopped, a call still running, its undo
            started, or an effect after `position` that may have happened and whose partner
            could not say.
    """
    forks.fork(run_id, position=position, actor=actor, reason=reason)


def workflow_steps(workflow: str) -> list[str]:
    """The forward steps of the latest version of a graph workflow, in order (for pages that
    list what a run will do before it does it)."""
    return list(registry.latest(workflow).forward_steps)


def cancel(run_id: str, *, actor: str, reason: str) -> str | None:
    """Stop an unfinished run without keeping any money: its effects are undone by their
    compensations, then it ends CANCELLED; a step in flight finishes first. Recorded as an event
    with `actor` and `reason`. Returns None if it ended at once, else what happens next. The
    unfinished children its compensations will cancel (`cancel_children`) are cancelled at
    once too.

    Raises:
        ActionRefused: the run is finished, already undoing, or an outcome is unknown.
    """
    return _children.cancel(run_id, actor=actor, reason=reason)


def retry(run_id: str, *, actor: str, reason: str) -> None:
    """Resume a parked or failed run at the step where it stopped (see `store.run_retry`).

    Raises:
        ActionRefused: the run is not in a state where resuming is safe.
    """
    store.run_retry(run_id, actor=actor, reason=reason)


def signal(run_id: str, name: str, payload: Any = None, *, signal_id: str) -> Delivery:
    """Send signal `name` with `payload` to the run, exactly once per `signal_id`: from a
    webhook (`agentflow.webhooks`), a view, a shell (`manage.py agentflow_signal`). Returns
    "delivered", or "duplicate" when this `signal_id` was sent before (acknowledged; nothing
    happens again).

    The run need not wait for it yet: a signal is kept from the moment it arrives, and each
    `wait_for(name)` the run reaches consumes the oldest one kept of that name (in the order
    they arrived) and goes on at once; a signal that came after that wait's timeout stays kept
    for a later one. Consumed in the commit that ends the wait; a replay of the run reads it
    from there. One no wait ever takes stays on the run's page.

    Raises:
        InvalidInputError: a run id, name or signal id that is no text the database can
            hold (empty, too long, with NUL), or a payload that is not JSON.
        ActionRefused: no such run, the run is finished, or it is being cancelled: the reason
            says which.
    """
    if not _stored_text(run_id, None):
        raise InvalidInputError("a run id is text without NUL")
    if not _stored_text(name, 200):
        raise InvalidInputError("a signal needs a name (1-200 characters, without NUL)")
    if not _stored_text(signal_id, 200):
        raise InvalidInputError("a signal needs a signal_id (1-200 characters, without NUL)")
    if name.startswith(_children.SIGNAL_PREFIX):
        # The engine's own: a parent's wait for its children takes its report under it.
        raise InvalidInputError(f"signal names starting {_children.SIGNAL_PREFIX!r} are reserved")
    try:
        data = to_json(payload, f"the payload of signal {name!r}")
    except NotJSONError as exc:
        raise InvalidInputError(str(exc)) from None
    with privacy.run_scope(run_id, personal=True):  # sealed as the run's own fields are
        return store.signal_deliver(run_id, name, data, signal_id=signal_id)


def approve(
    run_id: str, *, actor: str, reason: str = "", digest: str | None = None, reply: str = ""
) -> None:
    """Approve the call the run waits to make (a step or tool declared `requires_approval`):
    recorded at its position with `actor` and `reason`, bound to the call's digest; the call
    then runs. `digest` (`snapshot(...).pending_approval["digest"]`, what the approver was
    shown): refused unless the run still waits for exactly that call. `actor` and `reason` are
    internal; `reply` is what the decision tells the person the run serves (one of the call's
    declared `Replies`, or words the operator wrote and saw in a preview; `ctx.decision.reply`).

    Raises:
        ActionRefused: nothing waits for approval (or it timed out, or a concurrent Cancel,
            Retry or fork changed the run first, or it waits for another call than `digest`).
    """
    _decide(run_id, approved=True, actor=actor, reason=reason, digest=digest, reply=reply)


def reject(
    run_id: str, *, actor: str, reason: str, digest: str | None = None, reply: str = ""
) -> None:
    """Reject the call the run waits to make: it does not run; a graph step records
    `{"approved": False, ..., "reply"}` (its `next` branches on it), a tool call answers the
    model `{"rejected": true, "reason": ..., "reply": ...}`.

    Raises:
        ActionRefused: as `approve`.
    """
    _decide(run_id, approved=False, actor=actor, reason=reason, digest=digest, reply=reply)


def _decide(
    run_id: str, *, approved: bool, actor: str, reason: str, digest: str | None, reply: str
) -> None:
    if not isinstance(actor, str) or not actor.strip():
        raise InvalidInputError("a decision needs the actor who made it")
    if not isinstance(reason, str):
        raise InvalidInputError("the reason is text")
    if digest is not None and not isinstance(digest, str):
        raise InvalidInputError("the digest is the text snapshot().pending_approval shows")
    if not isinstance(reply, str) or len(reply) > REPLY_MAX_CHARS:
        raise InvalidInputError(f"the reply is text of at most {REPLY_MAX_CHARS} characters")
    store.wait_decide(
        run_id,
        approved=approved,
        actor=actor.strip(),
        reason=reason.strip(),
        digest=digest,
        reply=reply.strip(),
    )


def delete_runs(run_ids: Iterable[str]) -> int:
    """Delete these runs, whatever their status, with their checkpoints and events; return how
    many runs were deleted. For clean-ups after tests and chaos runs, once no worker can run
    them any more; finished runs age out by themselves (`manage.py purge`,
    docs/protocol.md, "Retention")."""
    return store.runs_delete(ids=run_ids).runs


@dataclass(frozen=True, kw_only=True)
class StepSnapshot:
    seq: int
    name: str
    kind: str
    status: str
    attempts: int
    output: Any
    error: str
    finished_at: datetime | None
    #: FAILED and to be tried again (an effect's answer lost: it may have happened).
    retryable: bool = False
    #: The key its partner call was made under (the same for every attempt): what a test
    #: looks the effect up by at the partner.
    idempotency_key: str = ""


def may_have_happened(step: outcomes.Recorded) -> bool:
    """Whether this step's effect may have happened (docs/protocol.md, "Unknown outcomes"): made, or
    claimed and not yet proven absent. A page must not say "you have not been charged" while this
    holds."""
    return outcomes.may_have_happened(kind=step.kind, status=step.status, retryable=step.retryable)


@dataclass(frozen=True, kw_only=True)
class RunSnapshot:
    id: str
    workflow: str
    version: int
    status: str
    current_step: str
    error: str
    output: Any
    #: An operator cancelled it: it undoes what it did and ends CANCELLED.
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    steps: list[StepSnapshot]
    #: What a WAITING run waits for at its position: "approval", "signal", "timer", or None
    #: (not waiting, or waiting to retry a step).
    waiting_for: str | None = None
    #: While it waits for approval: `{"call", "arguments", "digest", "requested_at",
    #: "expires_at"}`, the exact call an operator approves or rejects.
    pending_approval: dict[str, Any] | None = None
    #: The build whose code runs it, and the one it started on (docs/deploys.md, "Builds").
    build: str = ""
    started_build: str = ""
    #: Why its step may not start now (empty: nothing holds it): the one reason for every
    #: hold (docs/deploys.md, "Builds"), e.g. "waiting for a worker of build X", or, while it waits
    #: for its turn at a partner (a `partner:<key>` hold), "waiting for stripe: rate limit".
    held: str = ""
    #: The run whose step started it (None: started by `start` or `start_many`).
    parent: str | None = None
    #: The runs it started, counted by status (`snapshot` gives {} for none).
    children: dict[str, int] | None = None
    #: 0-9, higher taken first (docs/workflows.md, "Priorities"); None: it has none.
    priority: int | None = None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES


def snapshot(run_id: str) -> RunSnapshot | None:
    """A read-only view of a run and its checkpoints, for status pages and tests."""
    run = WorkflowRun.objects.filter(pk=run_id).first()
    if run is None:
        return None
    steps = [
        StepSnapshot(
            seq=cp.seq,
            name=cp.name,
            kind=cp.kind,
            status=cp.status,
            attempts=cp.attempts,
            output=cp.output,
            error=cp.error,
            finished_at=cp.finished_at,
            retryable=cp.retryable,
            idempotency_key=cp.idempotency_key,
        )
        for cp in run.steps.order_by("seq")
    ]
    pending = store.wait_pending(run)
    approval = None
    if pending is not None and pending.kind == WaitKind.APPROVAL:
        approval = {
            "call": pending.name,
            "arguments": pending.arguments,
            "digest": pending.digest,
            "requested_at": pending.requested_at,
            "expires_at": pending.deadline,
        }
    return RunSnapshot(
        id=run.id,
        workflow=run.workflow,
        version=run.version,
        status=run.status,
        current_step=run.current_step,
        error=run.error,
        output=run.output,
        cancel_requested=run.cancel_requested,
        created_at=run.created_at,
        updated_at=run.updated_at,
        steps=steps,
        waiting_for=pending.kind if pending is not None else None,
        pending_approval=approval,
        build=run.build,
        started_build=run.started_build,
        held=routing.run_reason(run),
        parent=run.parent_id,
        children=store.children_counts(run.id),
        priority=run.priority,
    )


def _stored_text(value: object, max_chars: int | None) -> bool:
    """Text a column can hold: not empty, at most `max_chars`, nothing Postgres refuses."""
    return (
        isinstance(value, str)
        and bool(value)
        and (max_chars is None or len(value) <= max_chars)
        and storable_text(value)
    )
