"""Partner limits against real Postgres, played in this process
(docs/partner-limits.md, "What happens"): turns in arrival order, a wait that spends no attempt and
holds no worker, a 429 that slows the key for every run and is an answer (no unknown outcome), a
breaker that opens and probes once, places in flight freed when their lease runs out, an operator's
pause, and an unknown outcome kept unknown.

No assertion on elapsed time: rates are slow enough ("1/m") that the second call of a test is
always inside the interval, and what a later turn would be is moved on in the rows themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from itertools import pairwise

import pytest
from django.db.models import F
from django.test import override_settings
from django.utils import timezone

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus, StepStatus
from agentflow._core import builds
from agentflow._engine import runtime
from agentflow._limits import rules
from agentflow._limits import store as limits_store
from agentflow._recovery import sweeper
from agentflow.models import (
    PartnerEvent,
    PartnerSlot,
    PartnerState,
    PartnerWaiter,
    RunEvent,
    StepCheckpoint,
    WorkflowRun,
)
from tests.support import partner, workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

SLOW = {"acme": {"rate": "1/m"}}


def _checkpoint(run_id: str, name: str) -> StepCheckpoint:
    return StepCheckpoint.objects.get(run_id=run_id, name=name)


def _start() -> str:
    return durable.start(workflows.limited.name)


def _retries_due() -> None:
    """Every retry back-off is over (the test's stand-in for time)."""
    StepCheckpoint.objects.filter(status=StepStatus.FAILED).update(retry_at=None)


def _turns_given_now() -> None:
    """Every reserved turn and the key's next turn come due (the test's stand-in for time)."""
    PartnerWaiter.objects.filter(go_at__isnull=False).update(go_at=0.0)
    PartnerState.objects.update(next_turn_at=0.0, spent_until=0.0, blocked_until=0.0)


@override_settings(AGENTFLOW_PARTNER_LIMITS=SLOW)
def test_rate__a_call_past_its_turn_waits__no_attempt_spent_no_worker_held(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = _start()
    run = drive(run_id)  # look_up takes acme's turn; charge's call comes within the minute

    assert run.status == RunStatus.WAITING
    charge = _checkpoint(run_id, "charge")
    assert (charge.status, charge.retryable, charge.attempts) == (StepStatus.FAILED, True, 0)
    assert charge.error == "waiting for acme: rate limit"
    assert partner.effects() == {}  # the call never went
    [waiter] = PartnerWaiter.objects.filter(run_id=run_id)
    assert (waiter.partner, waiter.reason, waiter.seq) == ("acme", "rate limit", charge.seq)
    assert waiter.go_at is not None
    snapshot = durable.snapshot(run_id)
    assert snapshot is not None and snapshot.held == "waiting for acme: rate limit"

    _turns_given_now()
    run = drive(run_id)

    assert run.status == RunStatus.COMPLETED, run.error
    assert _checkpoint(run_id, "charge").attempts == 1
    assert len(partner.effects()) == 1
    assert not PartnerWaiter.objects.exists() and not PartnerSlot.objects.exists()


@override_settings(AGENTFLOW_PARTNER_LIMITS=SLOW)
def test_rate__turns_go_in_arrival_order(drive: Callable[[str], WorkflowRun]) -> None:
    first, second, third = _start(), _start(), _start()
    for run_id in (first, second, third):
        drive(run_id)

    turns = {w.run_id: w.go_at for w in PartnerWaiter.objects.all()}
    # The first took the key's only free turn at look_up; the others queue a minute apart.
    assert set(turns) == {first, second, third}
    assert turns[first] < turns[second] < turns[third]
    assert turns[second] - turns[first] == pytest.approx(60.0, abs=0.01)


@override_settings(AGENTFLOW_PARTNER_LIMITS={"acme": {"rate": "100/s"}})
def test_429__slows_the_key_for_every_run__an_answer_not_an_unknown(
    drive: Callable[[str], WorkflowRun],
) -> None:
    partner.script_answers("ok", "429")  # look_up answered, then charge refused
    run_id = _start()
    run = drive(run_id)

    assert run.status == RunStatus.WAITING
    charge = _checkpoint(run_id, "charge")
    # The partner did not act: no attempt spent, no "outcome unknown", nothing to reconcile.
    assert (charge.status, charge.attempts) == (StepStatus.FAILED, 0)
    assert charge.error == "waiting for acme: rate limited by the partner"
    state = PartnerState.objects.get(partner="acme")
    assert state.rate_limited_total == 1
    assert state.speed_floor == pytest.approx(0.5)
    assert state.blocked_until > state.speed_since  # Retry-After 0.5 s, for everyone
    assert PartnerEvent.objects.filter(kind=PartnerEvent.Kind.RATE_LIMITED).count() == 1

    # The block is the key's, however long: made an hour so that a slow machine cannot see it
    # end before the next run asks (Retry-After 0.5 s did, in a loaded matrix leg).
    PartnerState.objects.filter(partner="acme").update(blocked_until=F("blocked_until") + 3600)
    state.refresh_from_db()
    other = _start()
    drive(other)  # a run that never saw the 429 waits for the key's block too
    [waiter] = PartnerWaiter.objects.filter(run_id=other)
    assert waiter.go_at is not None and waiter.go_at >= state.blocked_until

    _turns_given_now()
    for each in (run_id, other):
        assert drive(each).status == RunStatus.COMPLETED
    assert len(partner.effects()) == 2


@override_settings(
    AGENTFLOW_PARTNER_LIMITS={"acme": {}},
    AGENTFLOW_BREAKER_FAILURES=2,
    AGENTFLOW_BREAKER_COOLDOWN_SECONDS=600.0,
)
def test_breaker__opens__waiters_spend_no_attempts__one_probe__oldest_first_resume(
    drive: Callable[[str], WorkflowRun],
) -> None:
    partner.script_answers("ok", "503", "503")  # look_up answered; charge 503 twice
    a = _start()
    drive(a)
    _retries_due()
    drive(a)
    state = PartnerState.objects.get(partner="acme")
    assert state.breaker == rules.OPEN and state.failures == 2
    assert _checkpoint(a, "charge").attempts == 2  # the failures themselves were attempts

    b, c = _start(), _start()
    drive(b)
    drive(c)  # their look_ups wait for the breaker: no call goes
    _retries_due()
    drive(a)
    assert _checkpoint(a, "charge").attempts == 2  # waiting spent nothing
    assert _checkpoint(a, "charge").error == "waiting for acme: breaker open"
    assert len(partner.calls()) == 3

    PartnerState.objects.update(probe_at=0.0)  # the cool-down is over
    limit = rules.limit_for("acme")
    assert limit is not None
    oldest = PartnerWaiter.objects.order_by("id").first()
    assert oldest is not None and oldest.run_id == b
    probe = limits_store.turn_take(limit, run_id=b, seq=oldest.seq)
    assert isinstance(probe, limits_store.Turn) and probe.probe
    behind = limits_store.turn_take(limit, run_id=a, seq=_checkpoint(a, "charge").seq)
    assert behind == limits_store.TurnWait(
        reason="breaker open", seconds=limits_store.RECHECK_SECONDS
    )
    limits_store.turn_return(limit, probe, outcome=limits_store.OK)  # the partner answered

    assert PartnerState.objects.get(partner="acme").breaker == rules.CLOSED
    resumed = list(PartnerWaiter.objects.order_by("id").values_list("run_id", "go_at"))
    assert [run for run, _ in resumed] == [c, a]  # b went as the probe
    assert [go for _, go in resumed] == sorted(go for _, go in resumed)  # oldest first
    kinds = list(PartnerEvent.objects.order_by("id").values_list("kind", flat=True))
    assert kinds.count(PartnerEvent.Kind.BREAKER_OPEN) == 1
    assert kinds[-1] == PartnerEvent.Kind.BREAKER_CLOSED
    _turns_given_now()
    for each in (b, c, a):
        assert drive(each).status == RunStatus.COMPLETED
    assert [_checkpoint(each, "charge").attempts for each in (a, b, c)] == [3, 1, 1]
    assert len(partner.effects()) == 3


@override_settings(AGENTFLOW_PARTNER_LIMITS={"acme": {"concurrency": 1}})
def test_concurrency__a_place_whose_holder_died__is_freed_by_its_lease(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """A worker SIGKILLed between taking its place and giving it back leaks it only until the
    lease runs out (or at once, once its liveness lock is seen free)."""
    limit = rules.limit_for("acme")
    assert limit is not None
    held = limits_store.turn_take(limit)  # a caller that will never give its place back
    assert isinstance(held, limits_store.Turn)
    run_id = _start()
    run = drive(run_id)
    assert run.status == RunStatus.WAITING
    [waiter] = PartnerWaiter.objects.filter(run_id=run_id)
    assert (waiter.reason, waiter.go_at) == ("concurrency", None)

    PartnerSlot.objects.filter(pk=held.slot).update(lease_expires_at=0.0)  # its lease ran out
    sweeper.sweep()

    waiter.refresh_from_db()
    assert waiter.go_at is not None  # the place went to the oldest waiter
    assert drive(run_id).status == RunStatus.COMPLETED


@override_settings(AGENTFLOW_PARTNER_LIMITS={"acme": {"concurrency": 1}})
def test_concurrency__a_freed_place__goes_to_the_highest_priority_then_the_oldest(
    drive: Callable[[str], WorkflowRun],
) -> None:
    limit = rules.limit_for("acme")
    assert limit is not None
    held = limits_store.turn_take(limit)  # the one place, taken
    assert isinstance(held, limits_store.Turn)
    line = [
        durable.start(workflows.limited.name),  # no priority: last
        durable.start(workflows.limited.name, priority=2),
        durable.start(workflows.limited.name, priority=8),
        durable.start(workflows.limited.name, priority=2),
    ]
    for run_id in line:
        assert drive(run_id).status == RunStatus.WAITING

    given = []
    for _ in line:
        limits_store.turn_return(limit, held, outcome=limits_store.OK)  # the place frees
        [waiter] = PartnerWaiter.objects.filter(go_at__isnull=False).exclude(run_id__in=given)
        given.append(waiter.run_id)
        held = limits_store.turn_take(limit, run_id=waiter.run_id, seq=waiter.seq)
        assert isinstance(held, limits_store.Turn)

    assert given == [line[2], line[1], line[3], line[0]]


@override_settings(AGENTFLOW_PARTNER_LIMITS={"acme": {}})
def test_pause__waits_until_resumed__recorded_with_actor_and_reason(
    drive: Callable[[str], WorkflowRun],
) -> None:
    limit = rules.limit_for("acme")
    assert limit is not None
    assert limits_store.partner_pause(limit, actor="ops", reason="acme asked us to stop")
    run_id = _start()
    assert drive(run_id).status == RunStatus.WAITING
    assert partner.calls() == []

    assert limits_store.partner_resume(limit, actor="ops", reason="acme is fine")
    _turns_given_now()
    assert drive(run_id).status == RunStatus.COMPLETED
    events = list(PartnerEvent.objects.order_by("id").values_list("kind", "actor", "detail"))
    assert events == [
        (PartnerEvent.Kind.PAUSED, "ops", "acme asked us to stop"),
        (PartnerEvent.Kind.RESUMED, "ops", "acme is fine"),
    ]


@override_settings(AGENTFLOW_PARTNER_LIMITS={"acme": {}})
def test_takeover_that_must_wait__stays_in_progress__may_have_happened(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """A lost owner's call may have happened: waiting for the partner never turns it into
    "did not happen" (docs/protocol.md, "Unknown outcomes"). The checkpoint stays IN_PROGRESS, its
    lease released."""
    run_id = _start()
    runtime.run_step(run_id, 1)  # look_up
    state = store.state_load(run_id, 2)
    assert state is not None
    claim = store.step_claim(state, workflows.limited.steps["charge"], 2, None)
    assert claim is not None  # ... and its worker was killed before it called
    StepCheckpoint.objects.filter(run_id=run_id, seq=2).update(
        lease_expires_at=WorkflowRun.objects.get(pk=run_id).created_at
    )
    limit = rules.limit_for("acme")
    assert limit is not None
    limits_store.partner_pause(limit, actor="ops", reason="maintenance")

    run = drive(run_id)  # the takeover finds acme paused

    assert run.status == RunStatus.WAITING
    charge = _checkpoint(run_id, "charge")
    assert charge.status == StepStatus.IN_PROGRESS and charge.lease_owner == ""
    assert charge.attempts == 1  # the takeover's attempt was given back
    snapshot = durable.snapshot(run_id)
    assert snapshot is not None
    [step] = [s for s in snapshot.steps if s.name == "charge"]
    assert durable.may_have_happened(step)


def test_unlimited_partner__no_rows_no_waits(drive: Callable[[str], WorkflowRun]) -> None:
    run = drive(_start())
    assert run.status == RunStatus.COMPLETED
    assert not PartnerState.objects.exists() and not PartnerSlot.objects.exists()


@override_settings(
    AGENTFLOW_PARTNER_LIMITS={"acme": {}},
    AGENTFLOW_BREAKER_FAILURES=1,
    AGENTFLOW_BREAKER_COOLDOWN_SECONDS=1.0,
)
def test_breaker__a_failed_probe__wakes_the_next_oldest_waiter_for_the_next_probe(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """Not the others' 30-second recheck: the next probe goes when the breaker allows it."""
    partner.script_answers("ok", "503")
    first = _start()
    drive(first)  # its charge's 503 opens the breaker
    second, third = _start(), _start()
    drive(second)
    drive(third)
    PartnerState.objects.update(probe_at=0.0)
    limit = rules.limit_for("acme")
    assert limit is not None
    probe = limits_store.turn_take(limit, run_id=second, seq=1)
    assert isinstance(probe, limits_store.Turn) and probe.probe
    before = WorkflowRun.objects.get(pk=third).wake_at

    limits_store.turn_return(limit, probe, outcome=limits_store.UNAVAILABLE, detail="503 again")

    state = PartnerState.objects.get(partner="acme")
    assert state.breaker == rules.OPEN and state.opened_times == 2
    woken = WorkflowRun.objects.get(pk=third).wake_at
    assert before is not None and woken is not None and woken < before  # sooner than 30 s


@override_settings(AGENTFLOW_PARTNER_LIMITS=SLOW)
def test_partner_wait_of_a_pinned_run__a_routing_hold__its_turn_goes_to_its_builds_queue(
    drive: Callable[[str], WorkflowRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partner wait is a routing hold (`partner:<key>`, docs/deploys.md, "Builds"): when the
    sweeper finds its turn may be asked, a run pinned to another build goes to that build's queue
    (never the shared one), or waits for that build's worker when it has none."""
    run_id = _start()
    assert drive(run_id).status == RunStatus.WAITING
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.hold == "partner:acme"
    held = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.HELD)
    assert (held.detail, held.data) == ("waiting for acme: rate limit", {"hold": "partner:acme"})
    sent: list[tuple[str, int, str | None]] = []
    monkeypatch.setattr(
        sweeper.dispatch,
        "send_step",
        lambda run_id, seq, *, queue=None, **_: sent.append((run_id, seq, queue)) or True,
    )
    store.worker_beat(
        name="w-other", build="other", queue=builds.queue("other"), lock=None, server=""
    )
    past = timezone.now() - timedelta(seconds=30)
    WorkflowRun.objects.filter(pk=run_id).update(build="other", pinned=True, wake_at=past)

    report = sweeper.sweep()

    assert report.requeued == [run_id]
    assert sent == [(run_id, run.current_seq, builds.queue("other"))]
    assert WorkflowRun.objects.get(pk=run_id).hold == ""

    # Its build has no live worker: it is held for that build, not published anywhere.
    sent.clear()
    WorkflowRun.objects.filter(pk=run_id).update(
        build="gone", hold="partner:acme", status=RunStatus.WAITING, wake_at=past
    )
    report = sweeper.sweep()

    assert (report.requeued, report.held, sent) == ([], [run_id], [])
    run.refresh_from_db()
    assert (run.status, run.hold) == (RunStatus.WAITING, "build:gone")
    snapshot = durable.snapshot(run_id)
    assert snapshot is not None and snapshot.held == "waiting for a worker of build gone"


@override_settings(AGENTFLOW_PARTNER_LIMITS={"acme": {}})
def test_partner_hold__a_paused_partner__kept_held_by_the_sweeper_with_its_reason(
    drive: Callable[[str], WorkflowRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    limit = rules.limit_for("acme")
    assert limit is not None
    limits_store.partner_pause(limit, actor="ops", reason="maintenance")
    run_id = _start()
    assert drive(run_id).status == RunStatus.WAITING
    sent: list[str] = []
    monkeypatch.setattr(sweeper.dispatch, "send_step", lambda run_id, *_, **__: sent.append(run_id))
    past = timezone.now() - timedelta(seconds=30)
    WorkflowRun.objects.filter(pk=run_id).update(wake_at=past)

    report = sweeper.sweep()

    assert (report.requeued, sent) == ([], [])
    run = WorkflowRun.objects.get(pk=run_id)
    assert run.hold == "partner:acme" and run.wake_at is not None and run.wake_at > past
    snapshot = durable.snapshot(run_id)
    assert snapshot is not None and snapshot.held == "waiting for acme: paused"

    limits_store.partner_resume(limit, actor="ops", reason="back")
    assert drive(run_id).status == RunStatus.COMPLETED
    assert WorkflowRun.objects.get(pk=run_id).hold == ""


def _reserved(partner_key: str) -> list[float]:
    """The turns reserved at the partner, in arrival order, as times (the schedule's plus its
    shift)."""
    shift = PartnerState.objects.get(partner=partner_key).turn_shift
    return [
        go_at + shift
        for go_at in PartnerWaiter.objects.filter(partner=partner_key)
        .order_by("id")
        .values_list("go_at", flat=True)
    ]


def _db_now() -> float:
    row = store.sql.fetch_one(f"SELECT {limits_store.epoch_now()}", [])
    assert row is not None
    return float(row[0])


@override_settings(
    AGENTFLOW_PARTNER_LIMITS=SLOW,
    AGENTFLOW_PARTNER_RECOVERY_SECONDS=1e9,  # the key does not climb back during the test
)
def test_429__the_key_learns_at_once__a_bound_not_a_timing() -> None:
    """What makes the 429s of a limit set above the partner's stop within seconds: after a
    429, no turn goes before its Retry-After, and every turn already reserved (the burst's
    queue, reserved at the old speed) is moved to the slowed speed in its order; a 429 of a
    call given its turn before the key slowed does not slow it again (it came at the old
    speed), one given after does. So after k such 429s the key runs at most limit / 2**k
    (down to the floor), and the 429s of one slowdown are at most the calls given turns
    before it."""
    limit = rules.limit_for("acme")
    assert limit is not None
    # Calls of the burst already given their turns when the first 429 comes (at a rate that
    # gives them all at once: only the time they were given counts here).
    fast = rules.Limit(partner="acme", rate_per_second=1e5)
    given = [limits_store.turn_take(fast) for _ in range(3)]
    first = limits_store.turn_take(limit)
    for n in range(5):  # the burst's queue: steps that reserved turns a minute apart
        wait = limits_store.turn_take(limit, run_id=f"wf_{n}", seq=1)
        assert isinstance(wait, limits_store.TurnWait) and wait.reason == "rate limit"
    before = _reserved("acme")
    assert [round(b - a, 6) for a, b in pairwise(before)] == [60.0] * 4

    assert isinstance(first, limits_store.Turn)
    limits_store.turn_return(limit, first, outcome=limits_store.RATE_LIMITED, block_seconds=1.0)

    state = PartnerState.objects.get(partner="acme")
    assert state.speed_floor == pytest.approx(0.5)
    after = _reserved("acme")
    assert min(after) >= state.blocked_until  # Retry-After, for every run
    assert [round(b - a, 6) for a, b in pairwise(after)] == [120.0] * 4  # half speed
    assert all(a >= b for a, b in zip(after, before, strict=True))  # none sooner, the order kept
    late = limits_store.turn_take(limit, run_id="wf_late", seq=1)  # a step that comes after the 429
    assert isinstance(late, limits_store.TurnWait)
    assert _reserved("acme")[-1] == pytest.approx(after[-1] + 120.0)  # behind, slowed too

    # The burst's other calls, given their turns before the key slowed, are refused as well:
    # no further slowing (it already slowed for them), only the block.
    for stale in given:
        assert isinstance(stale, limits_store.Turn)
        limits_store.turn_return(limit, stale, outcome=limits_store.RATE_LIMITED, block_seconds=1.0)
    state = PartnerState.objects.get(partner="acme")
    assert state.speed_floor == pytest.approx(0.5)
    assert state.rate_limited_total == 4

    # Calls given their turns after it and refused still: each halves the key, to the floor.
    for k in range(2, 6):
        PartnerWaiter.objects.all().delete()
        PartnerState.objects.update(next_turn_at=0.0, spent_until=0.0, blocked_until=0.0)
        fresh = limits_store.turn_take(limit)
        assert isinstance(fresh, limits_store.Turn)
        limits_store.turn_return(limit, fresh, outcome=limits_store.RATE_LIMITED, block_seconds=1.0)
        floor = PartnerState.objects.get(partner="acme").speed_floor
        assert floor <= max(rules.FLOOR_FACTOR, 0.5**k) + 1e-9
    assert floor == pytest.approx(rules.FLOOR_FACTOR)


@override_settings(AGENTFLOW_PARTNER_LIMITS=SLOW)
def test_rate__a_reserved_turn_is_kept__one_nobody_came_for_goes_to_whoever_is_there() -> None:
    """A step that comes for its reserved turn gets that turn, not a later one; a turn whose
    step has not come (a busy worker, a long broker queue) goes to a step that is there, and
    every reserved turn moves back: no turn is lost, none given twice, and no two turns
    closer than an interval."""
    limit = rules.limit_for("acme")
    assert limit is not None
    assert isinstance(limits_store.turn_take(limit), limits_store.Turn)
    for n in range(5):
        assert isinstance(
            limits_store.turn_take(limit, run_id=f"wf_{n}", seq=1), limits_store.TurnWait
        )
    reserved = _reserved("acme")

    # A minute on (the test's stand-in for time): the first reserved turn is due, a second
    # ago, and its step has not come.
    back = reserved[0] - _db_now() + 1.0
    PartnerWaiter.objects.update(go_at=F("go_at") - back)
    PartnerState.objects.update(spent_until=0.0, next_turn_at=F("next_turn_at") - back)
    due = _reserved("acme")
    there = limits_store.turn_take(limit, run_id="wf_there", seq=1)  # a newcomer that is there
    assert isinstance(there, limits_store.Turn) and there.sleep_seconds == 0.0
    moved = _reserved("acme")
    assert len(moved) == 5  # the newcomer went; nobody lost a turn
    assert all(b > a for a, b in zip(due, moved, strict=True))  # everyone moved back, in order
    assert [round(b - a, 6) for a, b in pairwise(moved)] == [60.0] * 4
    assert min(moved) >= there.given_at + 60.0 - 1e-6  # an interval after the one given

    # The first in the queue comes for its (moved) turn: that turn, not the key's next.
    first = PartnerWaiter.objects.order_by("id").first()
    assert first is not None
    back = moved[0] - _db_now() - 0.1
    PartnerWaiter.objects.update(go_at=F("go_at") - back)
    PartnerState.objects.update(spent_until=0.0, next_turn_at=F("next_turn_at") - back)
    turn_of_first = _reserved("acme")[0]
    next_turn = PartnerState.objects.get(partner="acme").next_turn_at
    mine = limits_store.turn_take(limit, run_id=first.run_id, seq=first.seq)
    assert isinstance(mine, limits_store.Turn)
    goes = mine.given_at + mine.sleep_seconds
    assert goes == pytest.approx(max(mine.given_at, turn_of_first), abs=1e-6)
    assert PartnerState.objects.get(partner="acme").next_turn_at == next_turn
    assert not PartnerWaiter.objects.filter(pk=first.pk).exists()
