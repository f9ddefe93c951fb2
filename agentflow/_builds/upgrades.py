"""Can this code take a run that another build started
(docs/deploys.md, "What happens to a run at its next step")? The rule, by run, without running
anything: no partner call, no model request, no write.

A graph run is resumed from its checkpoints by step name, so new code can take it when every
step it recorded is a step of the new definition, in the same order and of the same kind; the
step it is at exists (and waits, if it waits); and every compensation it may need still exists
under its name and still undoes the same step. Steps added after its position then run; removed
ones it has not reached are skipped. An agent run is replayed by its function, so new code can
take it when a dry replay of its recorded trajectory makes identical calls (fingerprints) up to
its position. Anything else is a difference, reported with its position, the two sides, and the
effects recorded past it that may have happened (what a wrong resume could repeat or forget).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentflow._base import outcomes
from agentflow._base.states import StepKind
from agentflow._core.registry import NEXT_CALL, CodeDefined, Workflow, undo_target


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """A checkpoint of the run, as the rule reads it."""

    seq: int
    name: str
    kind: str
    status: str
    retryable: bool
    idempotency_key: str
    output: Any = None
    arguments: Any = None


@dataclass(frozen=True, kw_only=True)
class RunFacts:
    """What the rule needs of a run (read by `agentflow._store.upgrade_facts`)."""

    id: str
    workflow: str
    version: int
    build: str
    input: Any
    current_step: str
    current_seq: int
    branch: int
    compensations: Sequence[str]
    #: An open wait (timer, signal, approval) at its position.
    waiting: bool
    recorded: Sequence[Recorded]
    #: The shape of the workflow on the run's build (`builds.summary`), when that build
    #: recorded one: what its compensations were.
    old_shape: Mapping[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class Check:
    """Whether the new code can take the run; if not, the first difference."""

    safe: bool
    reason: str = ""
    #: The position of the first difference (None: none, or not at a position).
    position: int | None = None
    #: The difference as two sides, for a diff: what was recorded and what the code says now.
    recorded: str = ""
    now: str = ""
    #: Effects recorded at or past the difference that may have happened.
    effects: list[dict[str, Any]] = field(default_factory=list)

    def diff(self) -> str:
        """The difference as a two-line diff (empty when safe)."""
        if self.safe:
            return ""
        return f"- {self.recorded}\n+ {self.now}"

    def as_json(self) -> dict[str, Any]:
        return {
            "safe": self.safe,
            "reason": self.reason,
            "position": self.position,
            "recorded": self.recorded,
            "now": self.now,
            "effects_past_divergence": self.effects,
        }


SAFE = Check(safe=True)

#: Loads the run's recorded calls for a replay: (replay_load, superseded_reusable, calls_load).
ReplayReads = tuple[
    Callable[[], Mapping[int, Any]], Callable[[], Sequence[Any]], Callable[[], Sequence[Any]]
]


def check(new: Workflow | None, run: RunFacts, reads: ReplayReads | None = None) -> Check:
    """Can `new` (this code's latest definition of the run's workflow) take `run`? `reads`:
    an agent run's recorded calls, for its dry replay."""
    if new is None:
        return _differs(run, None, f"this build has no workflow {run.workflow!r}", "", "(none)")
    if isinstance(new, CodeDefined):
        return _agent(new, run, reads)
    return _graph(new, run)


# --- graph runs -----------------------------------------------------------------------------------
def _graph(new: Workflow, run: RunFacts) -> Check:
    forward = new.forward_steps
    where = {name: index for index, name in enumerate(forward)}
    last: tuple[int, str] | None = None
    for cp in run.recorded:
        if undo_target(cp.name) is not None or _compensation(new, cp.name, run.old_shape):
            found = new.step_named(cp.name)
            if found is None or not found.compensation_only:
                return _differs(
                    run,
                    cp.seq,
                    f"compensation {cp.name!r} it ran is not in this build",
                    _side(cp.seq, cp.name, cp.kind),
                    "(no such compensation)",
                )
            continue
        step = new.steps.get(cp.name)
        if step is None or step.compensation_only:
            return _differs(
                run,
                cp.seq,
                f"step {cp.name!r} it recorded at {cp.seq} is not in this build",
                _side(cp.seq, cp.name, cp.kind),
                f"{cp.seq} (no step {cp.name!r})",
            )
        if step.kind != cp.kind:
            return _differs(
                run,
                cp.seq,
                f"step {cp.name!r} was a {cp.kind} step, now it is {step.kind}",
                _side(cp.seq, cp.name, cp.kind),
                _side(cp.seq, cp.name, step.kind),
            )
        index = where[cp.name]
        if last is not None and index <= last[0]:
            return _differs(
                run,
                cp.seq,
                f"order: it ran {last[1]!r} before {cp.name!r}; now {cp.name!r} comes first",
                _side(cp.seq, cp.name, cp.kind),
                f"{cp.name!r} before {last[1]!r}",
            )
        last = (index, cp.name)
        lost = _compensation_lost(new, run, cp)
        if lost:
            return _differs(run, cp.seq, lost, f"{cp.name} undone by its compensation", lost)
    at = new.step_named(run.current_step)
    if at is None:
        return _differs(
            run,
            run.current_seq,
            f"the step it is at, {run.current_step!r}, is not in this build",
            f"{run.current_seq} {run.current_step}",
            f"{run.current_seq} (no such step)",
        )
    if run.waiting and at.waits_for is None:
        return _differs(
            run,
            run.current_seq,
            f"it waits at {run.current_step!r}, which no longer waits",
            f"{run.current_seq} {run.current_step} (waits)",
            f"{run.current_seq} {run.current_step} (runs at once)",
        )
    for planned in run.compensations:
        if new.step_named(planned) is None:
            return _differs(
                run,
                run.current_seq,
                f"compensation {planned!r} it plans is not in this build",
                planned,
                "(no such compensation)",
            )
    old_failure = (run.old_shape or {}).get("on_failure")
    if old_failure and new.on_failure != old_failure:
        return _differs(
            run,
            None,
            f"its on_failure step {old_failure!r} is not this build's ({new.on_failure!r})",
            f"on_failure {old_failure}",
            f"on_failure {new.on_failure}",
        )
    return SAFE


def _compensation(new: Workflow, name: str, old: Mapping[str, Any] | None) -> bool:
    step = new.steps.get(name)
    if step is not None:
        return step.compensation_only
    return any(s["name"] == name and s["compensation_only"] for s in _old_steps(old))


def _old_steps(old: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    steps = (old or {}).get("steps")
    return steps if isinstance(steps, list) else []


def _compensation_lost(new: Workflow, run: RunFacts, cp: Recorded) -> str:
    """Why the compensation the recorded step `cp` may need is gone (empty: it is not)."""
    name = cp.name
    if not outcomes.may_have_happened(kind=cp.kind, status=cp.status, retryable=cp.retryable):
        return ""
    old = next((s for s in _old_steps(run.old_shape) if s["name"] == name), None)
    step = new.steps[name]
    wanted = old.get("compensate") if old is not None else step.compensate
    if not wanted:
        return ""
    undo = new.steps.get(wanted)
    if undo is None or not undo.compensation_only:
        return f"compensation {wanted!r} of {name!r} is not in this build"
    if step.compensate != wanted:
        return f"{name!r} is now undone by {step.compensate!r}, not {wanted!r}"
    return ""


# --- agent runs -----------------------------------------------------------------------------------
def _agent(new: CodeDefined, run: RunFacts, reads: ReplayReads | None) -> Check:
    for planned in run.compensations:
        if new.step_named(planned) is None:
            return _differs(
                run,
                run.current_seq,
                f"compensation {planned!r} it plans is not in this build",
                planned,
                "(no such compensation)",
            )
    if run.current_step != NEXT_CALL:
        return SAFE  # compensating: its planned steps are all there
    if reads is None:
        return _differs(run, None, "its recorded calls were not read", "", "")
    recorded, reusable, calls = reads
    try:
        divergence = new.difference(
            run_id=run.id,
            input=run.input,
            seq=run.current_seq,
            branch=run.branch,
            recorded=recorded(),
            reusable=reusable,
            calls=calls,
        )
    except Exception as exc:
        return _differs(
            run, None, f"replaying it raised {type(exc).__name__}: {exc}", "", "(raised)"
        )
    if divergence is not None:
        return _differs(
            run,
            divergence.position,
            f"diverged from its recorded history: {divergence.text()}",
            divergence.recorded,
            divergence.now,
        )
    return SAFE


# --- differences ----------------------------------------------------------------------------------
def _side(seq: int, name: str, kind: str) -> str:
    return f"{seq} {name} ({kind})"


def _differs(run: RunFacts, position: int | None, reason: str, recorded: str, now: str) -> Check:
    return Check(
        safe=False,
        reason=reason,
        position=position,
        recorded=recorded,
        now=now,
        effects=effects_past(run, position),
    )


def effects_past(run: RunFacts, position: int | None) -> list[dict[str, Any]]:
    """The run's effects at or after `position` (all of them when None) that may have
    happened, with their amounts where the call names one."""
    found = []
    for cp in run.recorded:
        if position is not None and cp.seq < position:
            continue
        if cp.kind != StepKind.EFFECT or not outcomes.may_have_happened(
            kind=cp.kind, status=cp.status, retryable=cp.retryable
        ):
            continue
        effect: dict[str, Any] = {
            "seq": cp.seq,
            "step": cp.name,
            "status": cp.status,
            "idempotency_key": cp.idempotency_key,
        }
        amount = _amount(cp.output) if cp.output is not None else None
        if amount is None:
            amount = _amount(cp.arguments)
        if amount is not None:
            effect["amount_cents"] = amount
        found.append(effect)
    return found


def _amount(value: Any, depth: int = 0) -> int | None:
    """An amount in cents named in a recorded output or call (`amount_cents`, `amount`)."""
    if depth > 3 or not isinstance(value, dict):
        return None
    for key in ("amount_cents", "amount", "fee_cents"):
        found = value.get(key)
        if isinstance(found, int) and not isinstance(found, bool):
            return found
    for nested in value.values():
        amount = _amount(nested, depth + 1)
        if amount is not None:
            return amount
    return None
