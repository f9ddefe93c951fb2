"""The model-based test of the money paths (docs/figures/chaos.md): a Hypothesis state machine over
a few refunds, graph and agent, on the real database and the real partner sandbox.

Its rules are what can happen to them — a step message delivered (in any order, twice, or
never), a delivery crashed or paused at a crash point, a sweep, time passing, an operator's
retry, resume, cancel or fork, an approver's approve or reject of a fee waiver (or its timeout),
a partner's outcome for its next call, the model's answers, a deploy (the registered refund
definition gains a step before the fee and the process's build changes under the runs in
flight) — and after every rule it checks, at the sandbox's ledger and in the database, I1 (one
effect per key), I7 (no run silently stuck) and I8 (no money kept without the service), and I5 (a
fenced-out worker changes nothing) whenever a paused worker wakes. At the end partners heal,
every message is delivered and sweeps run until quiet: every run must settle. Steps run here
through `runtime.run_step`, the Celery task's own entry; `seams` says how the process is taken
over, `exploration` runs it (for `chaos --model` and, at a small budget, the suite).
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import replace
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.test.utils import override_settings
from hypothesis import currently_in_test_context, target
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import TERMINAL_RUN_STATUSES, RunStatus
from agentflow._core import builds, faults, leases, registry
from agentflow._engine import runtime
from agentflow._recovery import sweeper
from agentflow._store import aging
from agentflow.models import WorkflowRun
from refunds import services
from refunds.chaos import evidence, invariants
from refunds.chaos.figures import Figures
from refunds.chaos.partners import Partners
from refunds.chaos.processes import airline_today
from refunds.chaos.seams import (
    LEASE_SECONDS,
    MODEL_ANSWERS,
    Message,
    Paused,
    PointPlan,
    Seams,
    SimulatedCrash,
    Worker,
)
from refunds.models import RefundRequest
from refunds.sandbox.airline import next_operating_day, owner_of

MAX_RUNS = 3
#: The new flight every customer asks for, some weeks after the airline's today (`words`).
NEW_FLIGHT, WEEKS_AHEAD = "SK1240", 14
WAIVER_DETAILS = "I was admitted to hospital on Sunday and cannot fly this week."
#: Partner calls the machine can make misbehave, one call at a time or all at once (outage).
#: The charge and the fee refund have rules of their own (where the money is); these share one.
ENDPOINTS = (
    "payment_intents.search",
    "refunds.list",
    "airline.cancel_seat",
    "airline.boarding_pass",
    "seat_cancellation.lookup",
    "crm.update",
    "smtp",
)
#: One call's outcome: applied then the answer lost; refused before applying (declined); the
#: partner timing out before applying (504); a plain 5xx.
OUTCOMES = {
    "lost": {"drop_rate": 1.0},
    "declined": {"error_rate": 1.0, "error_status": 402},
    "timed_out": {"error_rate": 1.0, "error_status": 504},
    "5xx": {"error_rate": 1.0, "error_status": 500},
}
#: How far time jumps: past every retry back-off, or past every lease and enqueue grace too.
TIME_STEPS = (301.0, LEASE_SECONDS + 1.0)
#: The end: at most this many rounds of deliver everything / time passes / sweep.
SETTLE_ROUNDS = 40
SETTLE_DELIVERIES = 100
#: The most messages one `work` rule delivers (a refund is about ten steps).
WORK_DELIVERIES = 12
#: Deploys one example may make, and the read step each adds just before the fee.
MAX_DEPLOYS = 2
FEE_SCHEDULE = "confirm_fee_schedule"


def words() -> str:
    """What every customer writes: a day the new flight flies, counted from the airline's today
    (the same all day, so a failure replays with the same words)."""
    day = next_operating_day(NEW_FLIGHT, airline_today() + timedelta(weeks=WEEKS_AHEAD))
    return f"Hi, please move me to {NEW_FLIGHT} on {day.isoformat()}. Thanks!"


engines = st.sampled_from(["graph", "agent"])
#: One customer in four has a card that declines (most runs should get as far as the money).
declinings = st.integers(min_value=0, max_value=3).map(lambda n: n == 3)
#: One customer in two asks to have the fee waived: the run waits for an approver first.
waiver_asks = st.booleans()
outcomes = st.sampled_from(sorted(OUTCOMES))
positions = st.integers(min_value=0, max_value=30)
run_picks = st.integers(min_value=0, max_value=MAX_RUNS - 1)
worker_picks = st.integers(min_value=0, max_value=1)


class MoneyMachine(RuleBasedStateMachine):
    """Set `seams`, `partners` and `figures` on a subclass (see `machine`), then run it."""

    seams: Seams
    partners: Partners
    figures: Figures

    def __init__(self) -> None:
        super().__init__()
        self.partners.reset()
        self.seams.reset()
        self.run_ids: list[str] = []
        self.workers = [self._new_worker(), self._new_worker()]
        self.paused: Paused | None = None
        self.scores = [0.0, 0]
        self.figures.examples += 1
        self.deployed: list[registry.Workflow] = []
        self.build: Any = None
        #: The builds deployed over, by their queue: their workers keep draining them.
        self.old_builds: dict[str, str] = {}

    def _new_worker(self) -> Worker:
        conninfo = leases.liveness_conninfo()
        assert conninfo, "the model-based test needs Postgres: liveness comes from its locks"
        return Worker(f"w{self.figures.examples}", conninfo)

    # --- runs -------------------------------------------------------------------------------
    @initialize(engine=engines, declining=declinings, waiver=waiver_asks)
    def first(self, engine: str, declining: bool, waiver: bool = False) -> None:
        self.start(engine, declining, waiver)

    @precondition(lambda self: len(self.run_ids) < MAX_RUNS)
    @rule(engine=engines, declining=declinings, waiver=waiver_asks)
    def start(self, engine: str, declining: bool, waiver: bool = False) -> None:
        """A customer asks; a declining card fails at the charge (the sandbox's DEC bookings);
        one asking for a fee waiver waits for an approver before the card or the seat."""
        # The same reference in every example (the sandbox is reset): a replay meets the same
        # booking, so a failure shrinks and replays exactly.
        reference = f"{'DEC' if declining else 'MDL'}{len(self.run_ids):03d}"
        owner = owner_of(reference)
        with override_settings(REFUNDS_ENGINE=engine):
            request = services.refund_request_create(
                email=owner.email,
                booking_reference=reference,
                last_name=owner.last_name,
                message=words(),
                submission_token=f"model-{secrets.token_hex(8)}",
                client_ip="127.0.0.1",
                waiver_reason="medical" if waiver else "",
                waiver_details=WAIVER_DETAILS if waiver else "",
            )
        assert request.workflow_id is not None
        self.run_ids.append(request.workflow_id)
        self._count("start")

    # --- the broker ------------------------------------------------------------------------
    @rule(index=positions, worker=worker_picks)
    def deliver(self, index: int, worker: int) -> None:
        if self._idle("deliver"):
            return
        self._deliver(self._take(index), worker, None)
        self._count("deliver")

    @rule(deliveries=st.integers(min_value=1, max_value=WORK_DELIVERIES))
    def work(self, deliveries: int) -> None:
        """A healthy worker takes the queue in order for a while (runs move on between the
        rules that interfere with them)."""
        for _ in range(deliveries):
            if not self.seams.queue:
                break
            self._deliver(self.seams.queue.pop(0), 0, None)
        self._count("work")

    @rule(index=positions, worker=worker_picks, point=st.sampled_from(faults.CRASH_POINTS))
    def deliver_and_crash(self, index: int, worker: int, point: str) -> None:
        if self._idle("deliver_and_crash"):
            return
        self._deliver(self._take(index), worker, PointPlan(point=point))
        self._count("deliver_and_crash")

    @rule(index=positions)
    def duplicate(self, index: int) -> None:
        if self._idle("duplicate"):
            return
        found = self.seams.queue[index % len(self.seams.queue)]
        self.seams.queue.append(Message(run_id=found.run_id, seq=found.seq, fresh=found.fresh))
        self._count("duplicate")

    @rule(index=positions)
    def lose(self, index: int) -> None:
        if self._idle("lose"):
            return
        self._take(index)
        self._count("lose")

    # --- stale workers ----------------------------------------------------------------------
    @rule(index=positions, worker=worker_picks, point=st.sampled_from(faults.CRASH_POINTS))
    def deliver_and_pause(self, index: int, worker: int, point: str) -> None:
        if self.paused is not None or self._idle("deliver_and_pause"):
            return
        message, plan = self._take(index), PointPlan(point=point, pause=True)
        chosen = self.workers[worker % len(self.workers)]
        thread = threading.Thread(target=self._in_thread, args=(message, chosen, plan))
        thread.start()
        while thread.is_alive() and not plan.paused.wait(0.005):
            pass
        if plan.paused.is_set():
            self.paused = Paused(message, chosen, plan, thread)
            self.workers.remove(chosen)  # busy until it wakes
            self.workers.append(self._new_worker())
        self._count("deliver_and_pause")

    @rule()
    def wake_paused(self) -> None:
        """The stale worker goes on; fenced out meanwhile, it changes nothing (I5), anywhere."""
        paused = self.paused
        if paused is None:
            self._count("wake_paused: none paused")
            return
        run_id = paused.message.run_id
        fenced = evidence.claim_mark(run_id, paused.message.seq) != paused.mark
        before = evidence.run_rows(run_id), self._effects(run_id)
        self._release(paused, die=False)
        after = evidence.run_rows(run_id), self._effects(run_id)
        assert not fenced or after == before, f"I5: a fenced-out worker changed {before} to {after}"
        self._count("wake_paused")

    @rule()
    def kill_paused(self) -> None:
        if self.paused is None:
            self._count("kill_paused: none paused")
            return
        self.seams.queue.append(self.paused.message.redelivery())
        self._release(self.paused, die=True)
        self._count("kill_paused")

    # --- recovery and time ------------------------------------------------------------------
    @rule()
    def sweep(self) -> None:
        self._old_workers_alive()
        sweeper.sweep()
        self._count("sweep")

    @rule(seconds=st.sampled_from(TIME_STEPS))
    def time_passes(self, seconds: float) -> None:
        aging.runs_age(self.run_ids, seconds=seconds)
        self._count("time_passes")

    # --- operators --------------------------------------------------------------------------
    @precondition(lambda self: self.run_ids)
    @rule(action=st.sampled_from(["retry", "resume", "cancel"]), run=run_picks)
    def operator(self, action: str, run: int) -> None:
        run_id = self._run(run)
        why = {"actor": "model", "reason": f"model-based test: {action}"}
        try:
            if action == "retry":
                durable.retry(run_id, **why)
            elif action == "resume":
                store.run_resume(run_id, **why)
            else:
                durable.cancel(run_id, **why)
        except durable.ActionRefused as exc:
            self.figures.refused[f"{action}: {str(exc)[:48]}"] += 1
        self._count(action)

    @precondition(lambda self: self.run_ids)
    @rule(run=run_picks, approved=st.booleans(), approver=st.sampled_from(["ann", "bob"]))
    def decide(self, run: int, approved: bool, approver: str) -> None:
        """An approver approves or rejects the waiver a run waits on (two approvers may both
        try; a run waiting for nothing, or past its timeout, refuses)."""
        decide = durable.approve if approved else durable.reject
        action = "approve" if approved else "reject"
        try:
            decide(self._run(run), actor=approver, reason=f"model-based test: {action}")
        except durable.ActionRefused as exc:
            self.figures.refused[f"{action}: {str(exc)[:48]}"] += 1
        self._count(action)

    @precondition(lambda self: self.run_ids)
    @rule(run=run_picks)
    def approval_times_out(self, run: int) -> None:
        """Nobody decides in time: the run's clock passes its approval's deadline (the next
        delivery, or the sweeper, takes the reject path). A run waiting for no approval is
        left alone, counted."""
        run_id = self._run(run)
        if not self._waiting_for_approval([run_id]):
            self._count("approval_times_out: none waits")
            return
        self._time_out_approvals([run_id])
        self._count("approval_times_out")

    @precondition(lambda self: self.run_ids)
    @rule(run=run_picks, position=st.integers(min_value=1, max_value=20))
    def fork(self, run: int, position: int) -> None:
        try:
            durable.fork(self._run(run), position=position, actor="model", reason="model: fork")
        except durable.ActionRefused as exc:
            self.figures.refused[f"fork: {str(exc)[:48]}"] += 1
        self._count("fork")

    # --- partners and the model -------------------------------------------------------------
    @rule(outcome=outcomes)
    def next_charge(self, outcome: str) -> None:
        self._next_call("payment_intents.create", outcome)

    @rule(outcome=outcomes)
    def next_fee_refund(self, outcome: str) -> None:
        self._next_call("refunds.create", outcome)

    @rule(endpoint=st.sampled_from(ENDPOINTS), outcome=outcomes)
    def next_partner_call(self, endpoint: str, outcome: str) -> None:
        self._next_call(endpoint, outcome)

    def _next_call(self, endpoint: str, outcome: str) -> None:
        self.partners.fault(endpoint=endpoint, count=1, **OUTCOMES[outcome])
        self._count(f"partner_{outcome}")

    @rule(on=st.booleans())
    def outage(self, on: bool) -> None:
        if on:
            for endpoint in ("payment_intents.create", "refunds.create", *ENDPOINTS):
                self.partners.fault(endpoint=endpoint, error_rate=1.0, error_status=503)
        else:
            self.partners.clear()
        self._count("outage_on" if on else "outage_off")

    @precondition(lambda self: self.run_ids)
    @rule(run=run_picks, how=st.sampled_from(MODEL_ANSWERS))
    def model_answers(self, run: int, how: str) -> None:
        refund = RefundRequest.objects.filter(workflow_id=self._run(run)).first()
        if refund is not None:
            self.seams.answers[refund.public_id] = how
        self._count(f"model_{how}")

    @precondition(lambda self: self.seams.model_generation < 2)
    @rule()
    def model_redeployed(self) -> None:
        self.seams.redeploy_model()
        self._count("model_redeployed")

    @precondition(lambda self: len(self.deployed) < MAX_DEPLOYS)
    @rule()
    def deploy(self) -> None:
        """A new build while runs are in flight: the refund workflow gains a read step just
        before the fee (the shape of the domain's next change) and this process's build id
        changes. Every later delivery is the new build's: runs move by rule at their next
        step, or stay on their build; the invariants are checked right after, as always."""
        current = registry.latest("refund")
        release = durable.Workflow(
            current.name, version=current.version + 1, on_failure=current.on_failure
        )
        for name, step in current.steps.items():
            if name == "calculate_penalty_fee" and FEE_SCHEDULE not in current.steps:
                release.steps[FEE_SCHEDULE] = replace(
                    step, name=FEE_SCHEDULE, fn=_fee_schedule, waits_for=None, next=None
                )
            release.steps[name] = step
        release.validate()
        old = builds.current()
        self.old_builds[builds.queue(old)] = old
        self._old_workers_alive()
        self.deployed.append(release)
        if self.build is not None:
            self.build.disable()
        self.build = override_settings(
            AGENTFLOW_BUILD_ID=f"model-{self.figures.examples}-{len(self.deployed)}"
        )
        self.build.enable()
        self._count("deploy")

    # --- the invariants ---------------------------------------------------------------------
    @invariant()
    def money_and_liveness(self) -> None:
        found = self._evidence()
        assert not invariants.i1_one_effect(found), invariants.i1_one_effect(found)
        assert not invariants.i8_no_money_kept(found), invariants.i8_no_money_kept(found)
        now = evidence.db_now()
        assert not invariants.i7_owned(found, now), invariants.i7_owned(found, now)
        self.figures.checks += 1
        kept, runs = found.money_kept(), found.runs.values()
        at_stake = sum(1.0 for r in runs if kept[r.id] and r.status != RunStatus.COMPLETED)
        self.scores = [max(self.scores[0], at_stake), max(r.branch for r in runs)]

    def teardown(self) -> None:
        """Partners heal, every message is delivered, sweeps run until quiet: every run must
        settle, finished or parked with its reason, and keep no money it should not."""
        try:
            if currently_in_test_context():  # not in `exploration.replay`
                target(self.scores[0], label="fees held by unfinished runs")  # steers the search
                target(float(self.scores[1]), label="forks")
            if self.paused is not None:
                self._release(self.paused, die=False)
            self.partners.clear()
            self.seams.answers.clear()
            self._old_workers_alive()
            self._settle()
            found = self._evidence()
            assert not invariants.i2_settled(found), invariants.i2_settled(found)
            assert not invariants.i1_one_effect(found), invariants.i1_one_effect(found)
            assert not invariants.i8_no_money_kept(found), invariants.i8_no_money_kept(found)
            self.figures.ends.update(run.status for run in found.runs.values())
        finally:
            self._clean_up()

    # --- helpers ----------------------------------------------------------------------------
    def _settle(self) -> None:
        for _ in range(SETTLE_ROUNDS):
            if self.seams.queue:
                for _ in range(SETTLE_DELIVERIES):  # bounded: a livelock must end the loop
                    if self.seams.queue:
                        self._deliver(self.seams.queue.pop(0), 0, None)
                continue
            active = WorkflowRun.objects.filter(id__in=self.run_ids).exclude(
                status__in=[*TERMINAL_RUN_STATUSES, RunStatus.NEEDS_ATTENTION]
            )
            if not active.exists():
                return
            # Nobody decides any more: every waiver still waiting times out to the fee path.
            self._time_out_approvals(self._waiting_for_approval(self.run_ids))
            aging.runs_age(self.run_ids, seconds=LEASE_SECONDS + 1.0)
            sweeper.sweep()

    def _deliver(self, message: Message, worker: int, plan: PointPlan | None) -> None:
        chosen = self.workers[worker % len(self.workers)]
        old = self.old_builds.get(message.queue or "")
        try:
            if old is None:
                self.seams.run_as(chosen, plan, lambda: self._step(message))
            else:  # a message on an older build's queue: that build's worker takes it
                with override_settings(AGENTFLOW_BUILD_ID=old):
                    self.seams.run_as(chosen, plan, lambda: self._step(message))
        except SimulatedCrash:
            self._worker_died(chosen)
            self.seams.queue.append(message.redelivery())

    def _old_workers_alive(self) -> None:
        """The builds deployed over keep a worker each (a rainbow deploy), which the roster
        counts: it takes the messages of their queues (`_deliver`)."""
        for queue, build in self.old_builds.items():
            store.worker_beat(name=f"model/{build}", build=build, queue=queue, lock=None, server="")

    def _step(self, message: Message) -> None:
        try:
            runtime.run_step(
                message.run_id, message.seq, redelivered=message.redelivered, fresh=message.fresh
            )
        except Exception as exc:  # the task fails and its message is acked: nothing redelivers
            self.figures.engine_errors[f"{type(exc).__name__}: {exc}"[:200]] += 1

    def _in_thread(self, message: Message, worker: Worker, plan: PointPlan) -> None:
        try:
            self.seams.run_as(worker, plan, lambda: self._step(message))
        except SimulatedCrash:
            pass  # killed while paused: `kill_paused` redelivers its message
        finally:
            connection.close()  # this thread's own connection, as a dead process's would close

    def _release(self, paused: Paused, *, die: bool) -> None:
        if die:
            paused.worker.die()
        paused.plan.die = die
        paused.plan.go_on.set()
        paused.thread.join()
        if not die:
            paused.worker.die()  # retired: it did its one delivery
        self.paused = None

    def _worker_died(self, worker: Worker) -> None:
        worker.die()
        self.workers[self.workers.index(worker)] = self._new_worker()

    def _waiting_for_approval(self, run_ids: list[str]) -> list[str]:
        waiting = []
        for run_id in run_ids:
            found = durable.snapshot(run_id)
            if found is not None and found.waiting_for == "approval":
                waiting.append(run_id)
        return waiting

    def _time_out_approvals(self, run_ids: list[str]) -> None:
        if run_ids:
            timeout = float(settings.AGENTFLOW_APPROVAL_TIMEOUT)
            aging.runs_age(run_ids, seconds=timeout + 1.0)

    def _idle(self, name: str) -> bool:
        """No message queued: the rule does nothing. (Which rules run must depend on the rules
        drawn so far alone, never on what the engine did: its timing varies between replays,
        and Hypothesis refuses a machine whose choices change under it.)"""
        if self.seams.queue:
            return False
        self._count(f"{name}: queue empty")
        return True

    def _take(self, index: int) -> Message:
        return self.seams.queue.pop(index % len(self.seams.queue))

    def _run(self, index: int) -> str:
        return self.run_ids[index % len(self.run_ids)]

    def _count(self, name: str) -> None:
        self.figures.rules[name] += 1

    def _evidence(self) -> evidence.Evidence:
        return evidence.gather(self.run_ids, self.partners.ledger())

    def _effects(self, run_id: str) -> dict[str, int]:
        ledger = self.partners.ledger(workflow_id=run_id)
        return {kind: len(ledger.get(kind, [])) for kind in evidence.EFFECT_STEPS}

    def _clean_up(self) -> None:
        for worker in self.workers:
            worker.die()
        if self.build is not None:
            self.build.disable()
        for release in reversed(self.deployed):
            registry.unregister(release)
        for build in self.old_builds.values():
            store.worker_gone(f"model/{build}")
        durable.delete_runs(self.run_ids)
        RefundRequest.objects.filter(workflow_id__in=self.run_ids).delete()


def _fee_schedule(ctx: durable.StepContext) -> dict[str, str]:
    """The deploy's new step: a read with nothing to undo."""
    return {"schedule": "standard"}


def machine(seams: Seams, partners: Partners, figures: Figures) -> type[MoneyMachine]:
    """The machine bound to this process's seams and partners, counting into `figures`."""
    return type(
        "MoneyMachine", (MoneyMachine,), {"seams": seams, "partners": partners, "figures": figures}
    )
