"""The store's compare-and-set writes against real Postgres: claims, fencing, failures, undo."""

from __future__ import annotations

import json
import threading
from base64 import b64decode
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus, StepStatus
from agentflow._core import leases, registry
from agentflow._core.registry import StepDef
from agentflow._engine import runtime
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.testing.waiting import wait_for
from tests.support import partner, workflows
from tests.support.engine import step_messages
from tests.support.processes import RedisServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

T = TypeVar("T")


def race(contender: Callable[[], T], *, threads: int = 2) -> list[T]:
    """Run `contender` in `threads` threads released together, each with its own connection."""
    barrier = threading.Barrier(threads)

    def one() -> T:
        try:
            barrier.wait(timeout=10)
            return contender()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda _: one(), range(threads)))


def race_run() -> tuple[store.StepState, StepDef]:
    """A fresh run whose first step is an effect, loaded the way the runtime loads it."""
    run_id = durable.start(workflows.race.name)
    run = store.state_load(run_id, 1)
    assert run is not None
    return run, workflows.race.steps["hold"]


def seen(run_id: str, seq: int = 1) -> store.CheckpointRow | None:
    """The checkpoint as the runtime reads it (with what the database's clock says of it)."""
    state = store.state_load(run_id, seq)
    assert state is not None
    return state.checkpoint


def expire_lease(run_id: str, seq: int = 1) -> store.CheckpointRow:
    StepCheckpoint.objects.filter(run_id=run_id, seq=seq).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    found = seen(run_id, seq)
    assert found is not None
    return found


def rows(run_id: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    steps = list(StepCheckpoint.objects.filter(run_id=run_id).order_by("seq").values())
    return steps, WorkflowRun.objects.filter(pk=run_id).values().get()


# --- claims -------------------------------------------------------------------------------------
def test_claim__two_threads_race_for_a_new_step__exactly_one_wins() -> None:
    run, step = race_run()

    claims = race(lambda: store.step_claim(run, step, 1, None))

    assert sum(claim is not None for claim in claims) == 1
    cp = StepCheckpoint.objects.get(run_id=run.id, seq=1)
    assert (cp.status, cp.attempts) == (StepStatus.IN_PROGRESS, 1)
    assert WorkflowRun.objects.get(pk=run.id).status == RunStatus.RUNNING


def test_claim__two_threads_race_to_take_over_an_expired_lease__exactly_one_wins() -> None:
    run, step = race_run()
    assert store.step_claim(run, step, 1, None) is not None
    expired = expire_lease(run.id)

    claims = race(lambda: store.step_claim(run, step, 1, expired))

    winners = [claim for claim in claims if claim is not None]
    assert len(winners) == 1
    assert (winners[0].attempt, winners[0].fence) == (2, 2)
    assert winners[0].outcome_unknown  # the first attempt may have made its effect
    assert StepCheckpoint.objects.get(run_id=run.id, seq=1).attempts == 2
    takeover = RunEvent.objects.get(run_id=run.id, kind=RunEvent.Kind.TAKEOVER)
    assert (takeover.seq, takeover.data["reason"]) == (1, "lease_expired")
    assert takeover.data["previous"]["fence"] == 1 and takeover.data["fence"] == 2


def test_claim__loses_to_a_live_lease() -> None:
    run, step = race_run()
    assert store.step_claim(run, step, 1, None) is not None

    assert store.step_claim(run, step, 1, seen(run.id)) is None
    assert StepCheckpoint.objects.get(run_id=run.id, seq=1).attempts == 1


def test_claim__a_renewal_committed_after_the_read__is_never_overwritten() -> None:
    """The claim decides expiry again, by the database's clock, at the moment it writes."""
    run, step = race_run()
    first = store.step_claim(run, step, 1, None)
    assert first is not None
    stale = expire_lease(run.id)  # read while the lease looked expired...
    assert store.lease_renew(run.id, 1, first.fence)  # ...then its owner renewed it

    assert store.step_claim(run, step, 1, stale) is None
    cp = StepCheckpoint.objects.get(run_id=run.id, seq=1)
    assert (cp.fence, cp.attempts, cp.lease_owner) == (1, 1, leases.current_owner()[0])


def test_claim__a_retry_is_not_claimed_before_its_retry_time_by_the_database_clock() -> None:
    run, step = race_run()
    first = store.step_claim(run, step, 1, None)
    assert first is not None
    workflow = workflows.race
    store.step_fail(
        run, workflow, step, 1, claim=first, seen=None, error="503", retry_in_seconds=30
    )
    waiting = seen(run.id)
    assert waiting is not None and store.claim_blocker(waiting) == "not due"
    state = store.state_load(run.id, 1)
    assert state is not None

    assert store.step_claim(state, step, 1, waiting) is None
    StepCheckpoint.objects.filter(run_id=run.id, seq=1).update(
        retry_at=timezone.now() - timedelta(seconds=1)
    )
    due = seen(run.id)
    assert store.claim_blocker(due) is None
    assert store.step_claim(state, step, 1, due) is not None


def test_hot_path__statements_are_prepared_and_planned_once_per_connection() -> None:
    """Planning a step statement costs Postgres more than running it, so the hot path's
    statements must be server-side prepared statements that Postgres reuses a plan for."""
    run_id = durable.start(workflows.race.name)
    for _ in range(20):
        store.state_load(run_id, 1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements")
        prepared = cursor.fetchall()
    loads = [row for row in prepared if "LEFT JOIN" in row[0] and "WHERE r.id" in row[0]]
    assert loads, f"the run load is not a prepared statement: {prepared}"
    _, generic, custom = loads[0]
    assert generic >= 10 and custom <= 5, (generic, custom)


def test_start__alone_commits_and_publishes_at_once__inside_a_transaction_on_its_commit(
    engine: RedisServer,
) -> None:
    run_id = durable.start(workflows.chain.name)
    assert WorkflowRun.objects.filter(pk=run_id).exists() and engine.queue_length() == 1

    with transaction.atomic():
        durable.start(workflows.chain.name)
        assert engine.queue_length() == 1  # the doorbell waits for the caller's commit
    assert engine.queue_length() == 2

    with pytest.raises(RuntimeError), transaction.atomic():
        durable.start(workflows.chain.name)
        raise RuntimeError("the caller's transaction rolls back")
    assert WorkflowRun.objects.count() == 2 and engine.queue_length() == 2


def test_claiming_load__claims_a_fresh_effect_step_as_step_claim_would() -> None:
    run_id = durable.start(workflows.race.name)
    step = workflows.race.steps["hold"]

    run, claim = store.state_load_claiming(run_id, 1, workflows.race, step)

    assert run is not None and run.checkpoint is None  # the state as it was before the claim
    assert claim is not None
    assert (claim.attempt, claim.outcome_unknown) == (1, False)
    cp = StepCheckpoint.objects.get(run_id=run_id, seq=1)
    assert (cp.status, cp.attempts, cp.kind, cp.name) == (
        StepStatus.IN_PROGRESS,
        1,
        "effect",
        "hold",
    )
    assert (cp.lease_owner, cp.lease_lock) == leases.current_owner()[:2]
    assert cp.lease_lock is not None  # this process holds its liveness lock
    assert cp.idempotency_key == durable.idempotency_key(run_id, 1)
    after = WorkflowRun.objects.get(pk=run_id)
    assert (after.status, after.wake_at) == (RunStatus.RUNNING, cp.lease_expires_at)


def test_claiming_load__two_threads_race__exactly_one_claims() -> None:
    run_id = durable.start(workflows.race.name)
    step = workflows.race.steps["hold"]

    results = race(lambda: store.state_load_claiming(run_id, 1, workflows.race, step))

    assert all(run is not None for run, _ in results)
    assert sum(claim is not None for _, claim in results) == 1
    assert StepCheckpoint.objects.get(run_id=run_id, seq=1).attempts == 1


@pytest.mark.parametrize("case", ["checkpoint exists", "other step", "cancelled", "other version"])
def test_claiming_load__claims_nothing_unless_the_step_is_fresh(case: str) -> None:
    run_id = durable.start(workflows.race.name)
    step = workflows.race.steps["hold"]
    definition = workflows.race
    if case == "checkpoint exists":
        run = store.state_load(run_id, 1)
        assert run is not None
        assert store.step_claim(run, step, 1, None) is not None
        StepCheckpoint.objects.filter(run_id=run_id).update(
            status=StepStatus.FAILED, retryable=True, lease_expires_at=None
        )
    elif case == "other step":
        step = workflows.chain.steps["charge"]
    elif case == "cancelled":
        durable.cancel(run_id, reason="test", actor="test")
    else:
        definition = durable.Workflow(workflows.race.name, version=99)
        try:
            definition.step("hold", kind="effect")(lambda ctx: None)
        finally:
            registry.unregister(definition)
    before = rows(run_id)

    run, claim = store.state_load_claiming(run_id, 1, definition, step)

    assert run is not None and claim is None
    assert rows(run_id) == before


def test_step_messages__carry_the_claim_hint_for_effect_steps_only(engine: RedisServer) -> None:
    run_id = durable.start(workflows.chain.name)  # prepare (read) -> charge (effect) -> finish
    [(args, kwargs)] = step_messages(engine)
    assert (args, kwargs) == ([run_id, 1], {})
    engine.client().flushall()  # this test plays the worker

    runtime.run_step(run_id, 1)
    [(args, kwargs)] = step_messages(engine)
    assert (args, kwargs) == ([run_id, 2], {"fresh": [workflows.chain.name, 1, "charge"]})
    engine.client().flushall()

    runtime.run_step(*args, **kwargs)  # claimed by its load, then completed
    cp = StepCheckpoint.objects.get(run_id=run_id, seq=2)
    assert (cp.status, cp.attempts) == (StepStatus.COMPLETED, 1)
    assert step_messages(engine) == [([run_id, 3], {})]


def test_completion__fenced_after_takeover__changes_nothing() -> None:
    run, step = race_run()
    first = store.step_claim(run, step, 1, None)
    assert first is not None
    second = store.step_claim(run, step, 1, expire_lease(run.id))
    assert second is not None
    before = rows(run.id)

    assert not store.step_complete(run, workflows.race, step, 1, first, {"late": True})
    assert not store.lease_renew(run.id, 1, first.fence)
    assert not store.step_fail(
        run,
        workflows.race,
        step,
        1,
        claim=first,
        seen=None,
        error="late failure",
        retry_in_seconds=None,
    )
    assert not store.run_park(run.id, 1, "late park", fence=first.fence, claimed=True)
    assert not store.run_park(run.id, 1, "late park", fence=first.fence)
    assert rows(run.id) == before
    late = RunEvent.objects.get(run_id=run.id, kind=RunEvent.Kind.LATE_COMPLETION)
    assert late.data == {"attempt": 1, "fence": 1, "output": {"late": True}}

    assert store.step_complete(run, workflows.race, step, 1, second, {"ok": True})
    after = WorkflowRun.objects.get(pk=run.id)
    assert (after.current_seq, after.current_step) == (2, "finish")
    assert StepCheckpoint.objects.get(run_id=run.id, seq=1).output == {"ok": True}


# --- claim_blocker: what the database's clock and locks say ------------------------------------
def _held_elsewhere(key: int) -> Any:
    """A separate session holding advisory lock `key`: a live owner in another process/host."""
    import psycopg

    from agentflow._core.leases import liveness_conninfo

    conninfo = liveness_conninfo()
    assert conninfo is not None
    conn = psycopg.connect(conninfo, autocommit=True)
    conn.execute("SELECT pg_advisory_lock(%s)", [key])
    return conn


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("absent", None),
        ("completed", "completed"),
        ("failed_retryable", None),
        ("failed_retry_later", "not due"),
        ("failed_permanent", "failed"),
        ("live_lease_own_lock", "leased"),
        ("live_lease_no_lock_recorded", "leased"),
        ("live_lease_lock_held_elsewhere", "leased"),
        ("live_lease_lock_free", None),
        ("live_lease_lock_free_claim_before_the_server_started", "leased"),
        ("expired_lease", None),
    ],
)
def test_claim_blocker(case: str, expected: str | None) -> None:
    run, step = race_run()
    if case != "absent":
        assert store.step_claim(run, step, 1, None) is not None
    later = timezone.now() + timedelta(seconds=30)
    changes: dict[str, Any] = {
        "absent": {},
        "completed": {"status": StepStatus.COMPLETED, "finished_at": timezone.now()},
        "failed_retryable": {"status": StepStatus.FAILED, "retryable": True},
        "failed_retry_later": {"status": StepStatus.FAILED, "retryable": True, "retry_at": later},
        "failed_permanent": {"status": StepStatus.FAILED, "retryable": False},
        "live_lease_own_lock": {},
        "live_lease_no_lock_recorded": {"lease_lock": None},
        "live_lease_lock_held_elsewhere": {"lease_lock": 123456789},
        "live_lease_lock_free": {"lease_lock": 987654321},
        # A restart frees every lock: one freed that way says nothing about its owner.
        "live_lease_lock_free_claim_before_the_server_started": {
            "lease_lock": 987654321,
            "started_at": timezone.now() - timedelta(days=3650),
        },
        "expired_lease": {"lease_expires_at": timezone.now() - timedelta(seconds=1)},
    }[case]
    StepCheckpoint.objects.filter(run_id=run.id, seq=1).update(**changes)
    other = _held_elsewhere(123456789) if case == "live_lease_lock_held_elsewhere" else None
    try:
        assert store.claim_blocker(seen(run.id)) == expected
    finally:
        if other is not None:
            other.close()


def test_claim__owner_whose_session_ended__taken_over_at_once_as_owner_gone() -> None:
    """Liveness from Postgres (docs/protocol.md, "Liveness"): the lease is live for 10 s more, but
    the session holding the owner's lock has ended, so the owner is gone, on whatever host it
    was."""
    run, step = race_run()
    assert store.step_claim(run, step, 1, None) is not None
    owner = _held_elsewhere(55555)
    StepCheckpoint.objects.filter(run_id=run.id, seq=1).update(lease_lock=55555)
    held = seen(run.id)
    assert store.step_claim(run, step, 1, held) is None  # its owner's session is alive

    owner.close()  # what SIGKILL does to a worker's sessions
    gone = wait_for(
        lambda: (found := seen(run.id)) is not None and found.claimable and found,
        what="the server to end the owner's session",
    )
    assert not gone.lease_expired
    claim = store.step_claim(run, step, 1, gone)

    assert claim is not None and claim.outcome_unknown and claim.fence == 2
    takeover = RunEvent.objects.get(run_id=run.id, kind=RunEvent.Kind.TAKEOVER)
    assert takeover.data["reason"] == "owner_gone"


# --- errors -------------------------------------------------------------------------------------
def _retry_eta(broker: RedisServer, run_id: str) -> datetime:
    """The ETA of the back-off message the failure published (Celery protocol 2 headers)."""
    for raw in broker.queued_messages():
        message = json.loads(raw)
        args = json.loads(b64decode(message["body"]))[0]
        if args == [run_id, 1] and message["headers"].get("eta"):
            return datetime.fromisoformat(message["headers"]["eta"])
    raise AssertionError(f"no retry message for {run_id} in the broker")


def test_retryable_error__waits_with_backoff_then_completes_under_the_same_key(
    engine: RedisServer, drive: Callable[[str], WorkflowRun]
) -> None:
    run_id = durable.start(workflows.flaky.name)
    engine.client().flushall()  # the first step's message: this test plays the worker
    failed_at = timezone.now()

    run = drive(run_id)

    assert run.status == RunStatus.WAITING
    assert run.wake_at is not None and run.wake_at > timezone.now()
    cp = StepCheckpoint.objects.get(run_id=run_id, seq=1)
    assert (cp.status, cp.retryable, cp.error) == (StepStatus.FAILED, True, "partner said 503")
    eta = _retry_eta(engine, run_id)
    policy = workflows.flaky.steps["charge"].retry
    backoff = (eta - failed_at).total_seconds()
    assert policy.base_seconds / 2 <= backoff <= policy.base_seconds + 1.0

    wait_for(lambda: timezone.now() >= eta, what="the retry's ETA")
    runtime.run_step(run_id, 1)  # what the worker does when the ETA message comes due
    run = drive(run_id)

    assert run.status == RunStatus.COMPLETED
    assert StepCheckpoint.objects.get(run_id=run_id, seq=1).attempts == 2
    key = durable.idempotency_key(run_id, 1)
    assert partner.effects() == {key: 1}
    assert partner.requests() == {key: 1}  # the failed attempt never reached the effect


def test_early_duplicate_during_backoff__does_not_retry_before_the_delay(
    engine: RedisServer, drive: Callable[[str], WorkflowRun]
) -> None:
    run_id = durable.start(workflows.flaky.name)
    engine.client().flushall()
    assert drive(run_id).status == RunStatus.WAITING
    eta = _retry_eta(engine, run_id)

    runtime.run_step(run_id, 1)  # a stray duplicate, long before the back-off is over

    assert timezone.now() < eta
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.WAITING
    assert [r["attempt"] for r in partner.executions(run_id)] == [1]


def test_permanent_error__fails_the_run_with_a_readable_reason(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.declined.name)

    run = drive(run_id)

    assert run.status == RunStatus.FAILED
    assert run.error == "charge: card declined"
    assert run.wake_at is None
    cp = StepCheckpoint.objects.get(run_id=run_id, seq=2)
    assert (cp.status, cp.retryable) == (StepStatus.FAILED, False)
    assert partner.effects() == {}


def test_permanent_error_after_effects__compensates_latest_first_then_on_failure(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.undo.name)

    run = drive(run_id)

    assert run.status == RunStatus.FAILED
    assert run.error == "confirm: card declined"
    steps = StepCheckpoint.objects.filter(run_id=run_id).order_by("seq")
    assert [(cp.name, cp.status) for cp in steps] == [
        ("book", StepStatus.COMPLETED),
        ("charge", StepStatus.COMPLETED),
        ("confirm", StepStatus.FAILED),
        ("refund", StepStatus.COMPLETED),
        ("unbook", StepStatus.COMPLETED),
        ("notify", StepStatus.COMPLETED),
    ]
    assert partner.effects() == {durable.idempotency_key(run_id, seq): 1 for seq in (1, 2, 4, 5, 6)}
    event = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.COMPENSATION)
    assert "refund@2, unbook@1, notify" in event.detail  # each names the call it undoes


def test_lease_keeper__renews_a_long_step_in_the_background(settings: Any) -> None:
    settings.AGENTFLOW_LEASE_SECONDS = 1  # renewals every 0.33 s
    run, step = race_run()
    claim = store.step_claim(run, step, 1, None)
    assert claim is not None
    first_expiry = StepCheckpoint.objects.get(run_id=run.id, seq=1).lease_expires_at
    lost = threading.Event()

    def renew(conn: Any) -> bool:
        assert conn is not None  # on Postgres, renewals go through the liveness connection
        return store.lease_renew(run.id, 1, claim.fence, conn=conn)

    with leases.kept_alive(renew, lost.set):
        wait_for(
            lambda: (
                StepCheckpoint.objects.get(run_id=run.id, seq=1).lease_expires_at > first_expiry
            ),
            what="a renewal",
        )
    assert not lost.is_set()
