"""Where a step goes and when it may start: decided here, and nowhere else
(docs/deploys.md, "What happens to a run at its next step").

Temporal decides which worker runs a task in its matching service, never in workflow code; this
module is ours. Steps, gateways, the runtime and the sweeper never compare builds themselves.

- `admit(run, seq)`, before anything of a step runs: a worker took the step's message. A run on
  this process's build goes on at once: a string compared on the row already loaded, so the
  check costs nothing when builds match. Otherwise the run moves to this build if this build is
  newer and can take it by rule (`agentflow._builds.upgrades`; recorded as an `upgraded` event, with
  the version it now runs), or it stays on its build: pinned (once, with the difference as an
  event) and its message forwarded to that build's own queue (`builds.queue`), which only that
  build's workers consume. A run is never taken by a build first seen before its own: a run that
  moved to B is never run by A's code again, so a rollback is safe for it.
- A step that must not start now **holds**: its run is WAITING with the reason, no message is
  out, no worker is held, and it is published again when it may go. `hold` is that one path for
  every reason; a `Hold` names its kind and key (`build:<id>`: no live worker of the build a run
  is pinned to), and each kind registers a `Gate` that says which keys may go now (`register`).
  The sweeper asks the gates for the held runs it finds due (`sweep_routes`); whatever frees a
  key may release its runs at once (`release`: a worker of the build, as it starts). A partner's
  turn (issue 27) is another kind on the same path: `partner:<key>`, recorded by the step that
  got no turn (`agentflow._limits.store.step_wait_turn`), whose gate asks partner limits' rows
  whether a turn may be asked now; partner limits alone decide whether the call goes.
- Publishers that know the run address pinned runs to their build's queue (`builds.route`);
  every other message goes to the shared queue, and the worker that takes it decides here.

Crash safety, line by line: every decision is recorded by a compare-and-set on what it read (the
run's build, its position, no live claim), then the message is published, then the worker acks.
Killed after the record and before the publish, the unacked message is delivered again and
decided again from the record (a pinned run is forwarded without a second check); a message
lost altogether is published again by the sweeper, to the same queue. Two workers of different
builds racing for one step cannot both act: a move is refused while a live claim runs the step,
and every claim and completion is fenced on the run's build (`store.steps`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from django.db import transaction

from agentflow import _concurrency
from agentflow import _store as store
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow._builds import upgrades
from agentflow._core import builds, dispatch, registry
from agentflow._limits.store import PARTNER_HOLD, partners_open
from agentflow.exceptions import partner_wait_reason
from agentflow.models import RunEvent, WorkflowRun

logger = logging.getLogger("agentflow.routing")  # the name hosts' LOGGING knows

#: A held run is looked at again this often by the sweeper (sooner when released): what it
#: costs is one cheap query per sweep over the held runs that are due.
HOLD_RECHECK_SECONDS = 5.0


# --- holds ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Hold:
    """Why a step may not start now: a kind (which gate decides) and a key (e.g. a build)."""

    kind: str
    key: str

    @property
    def token(self) -> str:
        """As the run records it (`WorkflowRun.hold`)."""
        return f"{self.kind}:{self.key}"

    @classmethod
    def parse(cls, token: str) -> Hold | None:
        kind, sep, key = token.partition(":")
        return cls(kind, key) if sep and kind and key else None

    def reason(self) -> str:
        gate = _gates.get(self.kind)
        return gate.reason(self.key) if gate is not None else f"held ({self.token})"


class Gate(Protocol):
    """Decides for one kind of hold whether its keys may go now."""

    def open(self, keys: Sequence[str]) -> set[str]:
        """Which of `keys` may go now (one query for all of them)."""
        ...

    def reason(self, key: str) -> str:
        """Why a run held on `key` waits, for the run page."""
        ...


_gates: dict[str, Gate] = {}


def register(kind: str, gate: Gate) -> None:
    """Make `kind` a kind of hold, decided by `gate`."""
    _gates[kind] = gate


class _BuildWorkers:
    """`build:<id>`: a run pinned to a build waits until a worker of that build is alive."""

    def open(self, keys: Sequence[str]) -> set[str]:
        live = store.workers_live(list(keys))
        return {key for key in keys if live.get(key)}

    def reason(self, key: str) -> str:
        return f"waiting for a worker of build {key}"


BUILD = "build"
register(BUILD, _BuildWorkers())


class _PartnerTurns:
    """`partner:<key>`: a step that got no turn at a partner
    (docs/partner-limits.md, "What happens") waits until it may ask for one again. Partner limits
    alone decide whether the call goes (`agentflow._limits`, its waiters in arrival order); this
    only says whether asking now is worth a message: not while an operator paused the partner or
    its breaker is open before its probe time."""

    def open(self, keys: Sequence[str]) -> set[str]:
        return partners_open(list(keys))

    def reason(self, key: str) -> str:
        return partner_wait_reason(key, "its turn")


PARTNER = PARTNER_HOLD
register(PARTNER, _PartnerTurns())


class _ConcurrencyKeys:
    """`concurrency:<digest>`: a run over its concurrency key's cap. Never opened from here:
    the key's admission decides who goes, one at a time (`store.concurrency`), and publishes."""

    def open(self, keys: Sequence[str]) -> set[str]:
        return set()

    def reason(self, key: str) -> str:
        return "waiting for its turn: another run with the same concurrency key is running"


CONCURRENCY = _concurrency.HOLD
register(CONCURRENCY, _ConcurrencyKeys())


def reason(token: str, *, stored: str = "") -> str:
    """The sentence for a run's recorded hold (empty: none). `stored`: the sentence recorded
    when it was held (a partner's turn: "waiting for stripe: rate limit", which only the
    limiter's answer to that step knew), used when it is about the same key."""
    found = Hold.parse(token) if token else None
    if found is None:
        return ""
    if stored and found.kind == PARTNER and stored.startswith(partner_wait_reason(found.key, "")):
        return stored
    if stored and found.kind == CONCURRENCY:
        return stored  # says the workflow and its cap
    return found.reason()


def run_reason(run: WorkflowRun) -> str:
    """Why a WAITING run's step may not start now, as the run page and `durable.snapshot`
    show it (empty: nothing holds it): the one reason surface for every kind of hold. A run
    in a parallel batch whose member waits for a partner's turn shows that member's reason
    while its siblings run (`store.batch_wait_turn`)."""
    if not run.hold or (run.status != RunStatus.WAITING and run.batch_last is None):
        return ""
    first, last = run.current_seq, (run.current_seq if run.batch_last is None else run.batch_last)
    stored = (
        RunEvent.objects.filter(
            run_id=run.id, kind=RunEvent.Kind.HELD, seq__gte=first, seq__lte=last
        )
        .order_by("-id")
        .values_list("detail", flat=True)
        .first()
    )
    return reason(run.hold, stored=stored or "")


def hold(
    run: store.StepState, seq: int, why: Hold, *, recheck_seconds: float | None = None
) -> bool:
    """The run waits, with the reason, holding no worker; looked at again by the sweeper (or
    released sooner). Returns whether it was held (False: it moved on meanwhile)."""
    held = store.run_hold(
        run.id,
        seq,
        build=run.build,
        hold=why.token,
        reason=why.reason(),
        recheck_seconds=recheck_seconds if recheck_seconds is not None else HOLD_RECHECK_SECONDS,
    )
    if held:
        logger.info("%s step %s held: %s", run.id, seq, why.reason())
    return held


def release(why: Hold, *, run_ids: Sequence[str] = ()) -> list[str]:
    """`why` no longer holds: its runs (all, or `run_ids`) are due again and published to
    where they belong once that commits."""
    with transaction.atomic():
        released = store.holds_release(why.token, run_ids=run_ids)
        for run in released:
            queue = builds.route(run.build, run.pinned)
            dispatch.send_step_on_commit(run.id, run.seq, queue=queue)
    return [run.id for run in released]


# --- a worker's message ---------------------------------------------------------------------------
def admit(run: store.StepState, seq: int) -> store.StepState | None:
    """May this process run the run's step `seq` now? The run as it goes on (moved to this
    build, if it just did), or None when this process must do nothing more with the message:
    it was forwarded, held or parked here, or another worker acts on it."""
    own = builds.current()
    if run.build == own:
        return run
    return _decide(run, seq, own)


def _decide(run: store.StepState, seq: int, own: str) -> store.StepState | None:
    store.build_known(own)
    if run.build and run.pinned:
        forward(run, seq)
        return None
    if run.build and not _newer(own, run.build):
        store.run_pin(
            run.id,
            build=run.build,
            reason=f"on build {run.build}, newer than this one ({own}): a run is never "
            "moved back to older code",
            data={"by": own},
        )
        forward(run, seq)
        return None
    workflow = _latest(run.workflow)
    check = upgrades.check(workflow, facts(run), reads=_reads(run, workflow))
    if check.safe and workflow is not None and workflow.versioning != "pinned":
        moved = store.run_move(
            run.id,
            seq,
            from_build=run.build,
            to_build=own,
            version=workflow.version,
            reason=f"moved from build {run.build or '(none)'} to {own} "
            f"({run.workflow} v{run.version} -> v{workflow.version})",
        )
        if not moved:
            # A live claim of its own build runs the step (it publishes what comes next), or
            # another worker moved or pinned it first: theirs to carry on.
            return None
        return replace(run, build=own, version=workflow.version, pinned=False, hold="")
    if not run.build:
        # Started before builds were recorded: no worker can be asked to run its old code.
        store.run_park(
            run.id,
            seq,
            f"no build can run it: it started before builds were recorded, and this build "
            f"({own}) cannot take it: {check.reason or 'its workflow is pinned'}",
            kind=RunEvent.Kind.VERSION_MISMATCH,
            fence=run.checkpoint.fence if run.checkpoint else None,
            data=check.as_json(),
        )
        return None
    why = (
        f"{run.workflow} is declared versioning='pinned'"
        if check.safe
        else f"build {own} cannot take it: {check.reason}"
    )
    store.run_pin(run.id, build=run.build, reason=why, data={"by": own, **check.as_json()})
    forward(replace(run, pinned=True), seq)
    return None


def forward(run: store.StepState, seq: int) -> None:
    """Send the step to its build's own queue, or hold it while that build has no live worker
    (its message would only sit there)."""
    if _gates[BUILD].open([run.build]):
        dispatch.send_step(run.id, seq, queue=builds.queue(run.build), priority=run.priority)
    else:
        hold(run, seq, Hold(BUILD, run.build))


def _newer(own: str, other: str) -> bool:
    """Was this build first seen after `other`? A build without a row is older than any."""
    seen = store.builds_first_seen([own, other])
    if own not in seen:
        store.build_record(own, builds.definitions_summary())
        seen = store.builds_first_seen([own, other])
    if other not in seen:
        return True
    mine, theirs = seen.get(own), seen[other]
    return mine is not None and (mine, own) > (theirs, other)


def _latest(name: str) -> registry.Workflow | None:
    try:
        return registry.latest(name)
    except Exception:
        return None


# --- what the rule reads --------------------------------------------------------------------------
def facts(run: store.StepState) -> upgrades.RunFacts:
    """The run as `upgrades.check` reads it (its checkpoints, its open wait, its old shape)."""
    return upgrades.RunFacts(
        id=run.id,
        workflow=run.workflow,
        version=run.version,
        build=run.build,
        input=run.input,
        current_step=run.current_step,
        current_seq=run.current_seq,
        branch=run.branch,
        compensations=list(run.compensations),
        waiting=store.open_wait_at(run.id, run.current_seq, run.branch),
        recorded=[
            upgrades.Recorded(
                seq=cp.seq,
                name=cp.name,
                kind=cp.kind,
                status=cp.status,
                retryable=cp.retryable,
                idempotency_key=cp.idempotency_key,
                output=cp.output,
                arguments=cp.arguments,
            )
            for cp in store.run_steps_recorded(run.id)
        ],
        old_shape=store.build_shape(run.build, run.workflow) if run.build else None,
    )


def _reads(run: store.StepState, workflow: registry.Workflow | None) -> upgrades.ReplayReads | None:
    if not isinstance(workflow, registry.CodeDefined):
        return None
    seq = run.current_seq
    return (
        lambda: store.replay_load(run.id, seq + 1),
        lambda: store.superseded_reusable(run.id, workflow),
        lambda: store.calls_load(run.id, seq + 1),
    )


def decide(run: store.StepState) -> tuple[str, upgrades.Check]:
    """What this build would do with `run` at its next step, without doing it (the deploy
    check and the operator's move ask this): "upgrade", "pinned" or "park", and the check."""
    own = builds.current()
    if run.build == own:
        return "upgrade", upgrades.SAFE
    workflow = _latest(run.workflow)
    check = upgrades.check(workflow, facts(run), reads=_reads(run, workflow))
    if run.build and run.pinned:
        return "pinned", check
    if check.safe and workflow is not None and workflow.versioning != "pinned":
        return "upgrade", check
    return ("pinned" if run.build else "park"), check


# --- an operator's move ---------------------------------------------------------------------------
def move(run_id: str, *, actor: str, reason: str) -> str | None:
    """Move a pinned or parked run to this process's build (the operator's "move to the current
    build"), after the same check a worker makes: refused with the difference when it is not
    safe (DBOS's fork onto a new version, with the check in front). A parked run then resumes
    as a retry does. Raises `store.ActionRefused`."""
    found = WorkflowRun.objects.filter(pk=run_id).values_list("current_seq", "status").first()
    if found is None:
        raise store.ActionRefused("there is no such run")
    seq, status = found
    if status not in (*ACTIVE_RUN_STATUSES, RunStatus.NEEDS_ATTENTION):
        raise store.ActionRefused(f"it is {status}: a finished run stays where it ended")
    run = store.state_load(run_id, seq)
    assert run is not None
    own = builds.current()
    if run.build == own:
        raise store.ActionRefused(f"it is on the current build ({own}) already")
    workflow = _latest(run.workflow)
    check = upgrades.check(workflow, facts(run), reads=_reads(run, workflow))
    if not check.safe or workflow is None:
        raise store.ActionRefused(
            f"build {own} cannot take it: {check.reason}\n{check.diff()}".rstrip()
        )
    store.build_known(own)
    moved = store.run_move(
        run_id,
        seq,
        from_build=run.build,
        to_build=own,
        version=workflow.version,
        kind=RunEvent.Kind.OPERATOR_MOVE,
        actor=actor,
        reason=f"moved from build {run.build or '(none)'} to {own}: {reason}",
        statuses=[*ACTIVE_RUN_STATUSES, RunStatus.NEEDS_ATTENTION],
    )
    if not moved:
        raise store.ActionRefused("it changed meanwhile, or a worker is running its step")
    if status == RunStatus.NEEDS_ATTENTION:
        store.run_retry(run_id, actor=actor, reason=reason)
    else:
        dispatch.send_step(run_id, seq)
    return f"moved to build {own}"


# --- the sweeper's due runs -----------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Route:
    """Where the sweeper sends a due run: publish (to `queue`; None: the shared one), or keep
    it held (`hold`), or hold it now (`hold` and `new_hold`)."""

    run: store.DueRun
    queue: str | None = None
    hold: Hold | None = None
    new_hold: bool = False


def sweep_routes(runs: Sequence[store.DueRun]) -> list[Route]:
    """For each due run, what the sweeper does: the gates are asked once per kind for every key
    the due runs name, so a sweep with nothing held costs nothing more."""
    own = builds.current()
    wanted: dict[str, set[str]] = {}
    for run in runs:
        held = Hold.parse(run.hold) if run.hold else None
        if held is not None:
            wanted.setdefault(held.kind, set()).add(held.key)
        if run.pinned and run.build and run.build != own:
            wanted.setdefault(BUILD, set()).add(run.build)
    opened = {
        kind: (_gates[kind].open(sorted(keys)) if kind in _gates else set(keys))
        for kind, keys in wanted.items()
    }
    routes = []
    for run in runs:
        held = Hold.parse(run.hold) if run.hold else None
        queue = builds.route(run.build, run.pinned)
        elsewhere = run.pinned and run.build and run.build != own
        if held is not None and held.key not in opened.get(held.kind, set()):
            routes.append(Route(run=run, hold=held))
        elif (
            elsewhere
            and (held is None or held.kind != BUILD)
            and run.build not in opened.get(BUILD, set())
        ):
            # Free to go (a partner's turn may be asked), but its build has no live worker.
            routes.append(Route(run=run, hold=Hold(BUILD, run.build), new_hold=True))
        else:
            routes.append(Route(run=run, queue=queue))
    return routes


def hold_due(route: Route) -> bool:
    """The sweeper holds a due run whose gate is closed (inside the sweep's transaction)."""
    assert route.hold is not None
    run = route.run
    return store.run_hold(
        run.id,
        run.seq,
        build=run.build,
        hold=route.hold.token,
        reason=route.hold.reason(),
        recheck_seconds=HOLD_RECHECK_SECONDS,
    )
