"""Claims and fences against real Postgres, in this process: a worker that loaded a run before an
operator acted (a cancel, a fork) changes nothing after it, a replay that fails over a recorded
call parks instead of looping, and a claim knows which database server its lock was held on.

A "stale worker" is played in two phases with the calls the runtime makes: it loads the run
(`store.state_load`), the operator acts, then it claims or writes with what it loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper
from django.db.models.functions import Now
from django.utils import timezone

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus
from agentflow._core import leases
from agentflow._core.registry import StepDef
from agentflow._engine import runtime
from agentflow._store import sql
from agentflow.agent import loop as agent_loop
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from tests.support import partner, workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


def _names(run_id: str) -> list[str]:
    return list(
        StepCheckpoint.objects.filter(run_id=run_id).order_by("seq").values_list("name", flat=True)
    )


# --- finding 4: a worker that loaded the run before a cancel ----------------------------------
def test_claim__a_worker_that_loaded_the_charge_before_a_cancel__charges_nothing(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """The slow-path claim used to be fenced only on "active at seq 2", and the cancel put its
    first compensation at seq 2: the stale worker charged, and the compensation then parked
    the run as a "non-deterministic definition" that no console action could free."""
    run_id = durable.start(workflows.cancellable.name)
    runtime.run_step(run_id, 1)  # book
    stale = store.state_load(run_id, 2)  # a worker has loaded the charge...
    assert stale is not None and stale.checkpoint is None

    outcome = durable.cancel(run_id, actor="ops", reason="customer withdrew")
    charge = workflows.cancellable.steps["charge"]
    claim = store.step_claim(stale, charge, 2, stale.checkpoint)  # ...and claims after it

    assert outcome == "cancelling: undoing with unbook@1, notify first"
    assert claim is None
    run = drive(run_id)
    assert run.status == RunStatus.CANCELLED, run.error
    assert _names(run_id) == ["book", "unbook", "notify"]
    assert [e["step"] for e in partner.executions(run_id)] == ["book", "unbook", "notify"]
    assert len(partner.effects()) == 3  # no charge


def test_cancel__at_a_step_boundary__its_compensation_takes_a_seq_of_its_own() -> None:
    run_id = durable.start(workflows.cancellable.name)
    runtime.run_step(run_id, 1)  # book; the charge at 2 was never claimed

    durable.cancel(run_id, actor="ops", reason="customer withdrew")

    run = WorkflowRun.objects.get(pk=run_id)
    assert (run.current_seq, run.current_step) == (3, "unbook@1")


def test_db_step__a_worker_that_loaded_it_before_a_cancel__writes_nothing(
    drive: Callable[[str], WorkflowRun],
) -> None:
    run_id = durable.start(workflows.noted.name)
    runtime.run_step(run_id, 1)  # book
    stale = store.state_load(run_id, 2)
    assert stale is not None

    durable.cancel(run_id, actor="ops", reason="customer withdrew")
    note = workflows.noted.steps["note"]
    with transaction.atomic():
        written = store.unclaimed_complete(stale, workflows.noted, note, 2, None, {"noted": 1})

    assert not written
    run = drive(run_id)
    assert run.status == RunStatus.CANCELLED, run.error
    assert _names(run_id) == ["book", "unbook", "notify"]


#: The same stale claim on the embedded SQLite default (`make run`), where every claim takes
#: the slow path: run in a `manage.py shell` of its own, since this suite's database is Postgres.
SQLITE_STALE_CLAIM = """
import json
from agentflow import durable, _store as store
from agentflow._engine import runtime
from agentflow.models import StepCheckpoint, WorkflowRun
from agentflow._base.states import ACTIVE_RUN_STATUSES
from tests.support import workflows

run_id = durable.start(workflows.cancellable.name)
runtime.run_step(run_id, 1)
stale = store.state_load(run_id, 2)
durable.cancel(run_id, actor="ops", reason="customer withdrew")
claim = store.step_claim(stale, workflows.cancellable.steps["charge"], 2, None)
for _ in range(10):
    run = WorkflowRun.objects.get(pk=run_id)
    if run.status not in ACTIVE_RUN_STATUSES:
        break
    runtime.run_step(run_id, run.current_seq)
steps = StepCheckpoint.objects.filter(run_id=run_id).order_by("seq")
names = list(steps.values_list("name", flat=True))
print(json.dumps({"claimed": claim is not None, "status": run.status, "steps": names}))
"""


def test_claim__on_the_embedded_sqlite_default__a_stale_worker_charges_nothing_either(
    tmp_path: Path,
) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
        "AGENTFLOW_VAR_DIR": str(tmp_path),
        "CELERY_BROKER_URL": "agentflowfs://localhost//",
        "AGENTFLOW_WORKFLOW_MODULES": "tests.support.workflows",
    }

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=settings.BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    manage("migrate", "--noinput", "-v", "0")
    report = json.loads(manage("shell", "-c", SQLITE_STALE_CLAIM).strip().splitlines()[-1])

    assert report == {
        "claimed": False,
        "status": RunStatus.CANCELLED,
        "steps": ["book", "unbook", "notify"],
    }
    assert [e["step"] for e in partner.executions()] == ["book", "unbook", "notify"]


# --- finding 5: a fork restarted fence numbers ------------------------------------------------
def _next_call(run_id: str, seq: int) -> tuple[store.StepState, StepDef]:
    """A worker's first phase on an agent run: load it, replay up to its next call."""
    state = store.state_load(run_id, seq)
    assert state is not None
    outcome = agent_loop.replay(
        workflows.agent,
        run_id=run_id,
        input=state.input,
        seq=seq,
        branch=state.branch,
        recorded=store.replay_load(run_id, seq + 1),
        reusable=lambda: store.superseded_reusable(run_id, workflows.agent),
        calls=lambda: store.calls_load(run_id, seq + 1),
    )
    assert isinstance(outcome, agent_loop.NextCall), outcome
    return state, outcome.step


def test_fork__a_stale_model_call_completing_after_it__matches_nothing_in_the_new_branch(
    drive: Callable[[str], WorkflowRun],
) -> None:
    """The new branch's claim at the set-aside position used to get fence 1 again: the stale
    worker's answer was recorded as the new branch's, and the new branch's worker fenced out."""
    run_id = durable.start(workflows.agent.name)
    for seq in (1, 2, 3):
        runtime.run_step(run_id, seq)  # turn 1 and its two lookups
    old, turn = _next_call(run_id, 4)
    stale = store.step_claim(old, turn, 4, None)  # turn 2; its worker stalls past its lease
    assert stale is not None
    StepCheckpoint.objects.filter(run_id=run_id, seq=4).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1), lease_lock=None
    )
    assert store.run_park(run_id, 4, "set aside by an operator", fence=stale.fence)
    durable.fork(run_id, position=4, actor="ops", reason="ask turn 2 again")
    new, again = _next_call(run_id, 4)
    fresh = store.step_claim(new, again, 4, None)
    assert fresh is not None

    late = store.step_complete(old, workflows.agent, turn, 4, stale, turn.fn(None))  # type: ignore[arg-type]
    on_time = store.step_complete(new, workflows.agent, again, 4, fresh, again.fn(None))  # type: ignore[arg-type]

    assert (late, on_time) == (False, True)
    event = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.LATE_COMPLETION)
    assert event.data["fence"] == stale.fence < fresh.fence
    assert drive(run_id).status == RunStatus.COMPLETED


# --- finding 6: a replay that raises over a recorded call -------------------------------------
def test_replay__raises_while_an_effect_attempt_is_recorded_next__parked_outcome_unknown() -> None:
    """`run_fail_between_calls` refused (a call is recorded there) and nothing else was written:
    the run stayed active and the sweeper republished it for ever."""
    run_id = durable.start(workflows.moody.name)
    runtime.run_step(run_id, 1)  # prepare
    state = store.state_load(run_id, 2)
    assert state is not None
    outcome = agent_loop.replay(
        workflows.moody,
        run_id=run_id,
        input=state.input,
        seq=2,
        branch=0,
        recorded=store.replay_load(run_id, 3),
        reusable=list,
        calls=list,
    )
    assert isinstance(outcome, agent_loop.NextCall)
    claim = store.step_claim(state, outcome.step, 2, None)  # the charge's worker dies...
    assert claim is not None
    StepCheckpoint.objects.filter(run_id=run_id, seq=2).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1), lease_lock=None
    )
    partner.release(f"{run_id}/moody")  # ...and the function no longer makes that call

    runtime.run_step(run_id, 2, redelivered=True)

    run = WorkflowRun.objects.get(pk=run_id)
    assert run.status == RunStatus.NEEDS_ATTENTION, (run.status, run.error)
    assert run.error.startswith("outcome unknown: charge at position 2")
    assert "the function changed its mind" in run.error
    event = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.OUTCOME_UNKNOWN)
    assert event.data["fence"] == claim.fence
    runtime.run_step(run_id, 2)  # a duplicate changes nothing
    assert WorkflowRun.objects.get(pk=run_id).error == run.error


# --- finding 8a: on a promoted standby every lock looks free ------------------------------------
def _this_server() -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {leases.SERVER_SQL}")
        return str(cursor.fetchone()[0])


def test_liveness__a_claim_recorded_on_another_server__its_free_lock_proves_nothing() -> None:
    """A promoted standby holds none of the old primary's locks, and its postmaster may have
    started long before the claims it replicated: they all looked abandoned, and live owners
    were taken over. A free lock now counts only on the server the claim was made on."""
    run_id = durable.start(workflows.chain.name)
    runtime.run_step(run_id, 1)  # prepare
    state = store.state_load(run_id, 2)
    assert state is not None
    claim = store.step_claim(state, workflows.chain.steps["charge"], 2, None)
    assert claim is not None
    here = _this_server()
    cp = StepCheckpoint.objects.get(run_id=run_id, seq=2)
    assert cp.lease_server == here
    system_id, timeline = here.split("/")
    gone = leases.lock_key("old-primary/1/dead")  # a lock nobody holds on this server

    def claimable(server: str) -> bool:
        StepCheckpoint.objects.filter(pk=cp.pk).update(lease_lock=gone, lease_server=server)
        found = store.state_load(run_id, 2)
        assert found is not None and found.checkpoint is not None
        with transaction.atomic():
            swept = [due.reason for due in store.sweep_due(10) if due.id == run_id]
        assert swept == (["owner_gone"] if found.checkpoint.claimable else [])
        return found.checkpoint.claimable

    assert claimable(here)  # its owner died on this very server: taken over at once
    promoted = f"{system_id}/{int(timeline, 16) - 1:08X}"  # copied from the old timeline
    assert not claimable(promoted)  # the lease decides
    assert not claimable("")  # a claim that recorded no server


# --- finding 8b: the database's clock, not the app host's ---------------------------------------
def _host_clock_ahead(monkeypatch: pytest.MonkeyPatch, by: timedelta) -> None:
    """This process's clock off, as `AGENTFLOW_CLOCK_OFFSET_SECONDS` makes a worker's."""
    real_now = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real_now() + by)


def test_start__on_a_host_whose_clock_runs_an_hour_ahead__wakes_by_the_databases_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`wake_at` came from the host's clock: an hour ahead, a lost first message waited an
    hour for the sweeper instead of one enqueue grace."""
    _host_clock_ahead(monkeypatch, timedelta(hours=1))

    run_id = durable.start(workflows.chain.name)

    run = WorkflowRun.objects.get(pk=run_id)
    assert run.wake_at is not None
    due_by = sql.db_now() + store.enqueue_grace()
    assert due_by - timedelta(seconds=30) <= run.wake_at <= due_by


def test_purge__on_a_host_whose_clock_runs_a_day_ahead__keeps_what_the_database_says_is_young(
    drive: Callable[[str], WorkflowRun], monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = durable.start(workflows.chain.name)
    assert drive(run_id).status == RunStatus.COMPLETED
    aged = ExpressionWrapper(Now() - timedelta(days=29, hours=12), output_field=DateTimeField())
    WorkflowRun.objects.filter(pk=run_id).update(created_at=aged, updated_at=aged)
    _host_clock_ahead(monkeypatch, timedelta(days=1))

    deleted = store.runs_purge(older_than=timedelta(days=30))

    assert deleted.runs == 0
    assert WorkflowRun.objects.filter(pk=run_id).exists()
