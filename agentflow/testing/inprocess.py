"""Runs driven in the test's own process: no broker, no worker, the real database.

The engine publishes each step message through `agentflow._core.dispatch.send_step`; here those
messages are kept in an `Outbox` instead, and `run_to_end` plays the worker: it delivers the
run's current step (`agentflow._engine.runtime.run_step`, exactly what a worker's task calls) until
the run is finished or parked. `crash_at` makes a named crash point
(docs/protocol.md, "Crash points", `agentflow._core.faults.CRASH_POINTS`) kill the "worker" that
reaches
it, as SIGKILL would, and the next delivery is the broker's redelivery to a live one.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import connection
from django.db.models.functions import Now
from django.test import TestCase

from agentflow import _concurrency, durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus, StepStatus
from agentflow._core import dispatch, faults, leases
from agentflow._engine import runtime
from agentflow._store import aging
from agentflow.models import StepCheckpoint, WorkflowRun

__all__ = [
    "Crash",
    "Outbox",
    "SimulatedCrash",
    "StepMessage",
    "capture_messages",
    "crash_at",
    "crash_env",
    "run_to_end",
]


# --- step messages ------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepMessage:
    """One step message the engine published: run `run_id`'s step `seq`."""

    run_id: str
    seq: int
    #: Seconds the broker would hold it back (a short retry back-off), or None.
    countdown: float | None = None
    #: The priority the publisher gave it (0-9), or None: none given, or the run's own left
    #: for the publisher to read (docs/workflows.md, "Priorities").
    priority: int | None = None


@dataclass
class Outbox:
    """The step messages published while `capture_messages()` was open, in order."""

    messages: list[StepMessage] = field(default_factory=list)

    def for_run(self, run_id: str) -> list[StepMessage]:
        return [message for message in self.messages if message.run_id == run_id]

    def clear(self) -> None:
        self.messages.clear()

    def __len__(self) -> int:
        return len(self.messages)


_lock = threading.Lock()
_outbox: Outbox | None = None


@contextmanager
def capture_messages() -> Iterator[Outbox]:
    """Keep every step message published inside the block instead of sending it to a broker.

    Nested blocks share the outermost outbox. Messages published on commit are captured when
    the commit happens inside the block (in a `django_db(transaction=True)` test, at once).
    """
    global _outbox
    with _lock:
        outer, saved, saved_many = _outbox, dispatch.send_step, dispatch.send_steps
        if outer is not None:
            owner, outbox = False, outer
        else:
            owner, outbox = True, Outbox()
            _outbox = outbox

            def keep(
                run_id: str,
                seq: int,
                *,
                countdown: float | None = None,
                fresh: dispatch.Fresh | None = None,
                queue: str | None = None,
                priority: Any = None,
            ) -> bool:
                given = priority if isinstance(priority, int) else None
                outbox.messages.append(
                    StepMessage(run_id=run_id, seq=seq, countdown=countdown, priority=given)
                )
                return True

            def keep_many(steps: Sequence[tuple[str, int, Any, str | None, int | None]]) -> bool:
                for run_id, seq, _, _, priority in steps:
                    outbox.messages.append(StepMessage(run_id=run_id, seq=seq, priority=priority))
                return True

            dispatch.send_step = keep  # type: ignore[assignment]
            dispatch.send_steps = keep_many  # type: ignore[assignment]
    try:
        yield outbox
    finally:
        if owner:
            with _lock:
                dispatch.send_step = saved  # type: ignore[assignment]
                dispatch.send_steps = saved_many  # type: ignore[assignment]
                _outbox = None


# --- crashes ------------------------------------------------------------------------------------
class SimulatedCrash(BaseException):
    """The worker died at a crash point. A BaseException, like the SIGKILL it stands for: no
    `except Exception` in the engine or in a step catches it, and every open transaction
    rolls back as it unwinds."""


def _parse_point(where: str) -> tuple[str, str]:
    problem = faults.crash_at_problem(where) if where else "an empty crash point"
    if problem:
        raise ValueError(problem)
    step, _, point = where.rpartition(":")
    return step, point


def crash_env(where: str) -> dict[str, str]:
    """The environment that makes a real worker process SIGKILL itself at `where`
    ("STEP:POINT", POINT one of `agentflow._core.faults.CRASH_POINTS`) on the step's first attempt:

        agentflow_worker(env=crash_env("charge:after_effect"))
    """
    _parse_point(where)
    return {"AGENTFLOW_FAULTS": "1", "AGENTFLOW_CRASH_AT": where}


class _Worker:
    """A simulated worker process: an owner token of its own and the Postgres advisory lock
    that is its liveness (docs/protocol.md, "Liveness"), held on a connection of its own. When it
    "dies", the connection closes and the lock is free, exactly as after a SIGKILL."""

    def __init__(self) -> None:
        conninfo = leases.liveness_conninfo()
        if conninfo is None:
            raise RuntimeError(
                "crash_at needs Postgres (and AGENTFLOW_LIVENESS_DATABASE_URL not 'off'): "
                "without the owner's advisory lock a crashed step is only taken over when "
                "its lease runs out"
            )
        self.token = f"agentflow.testing/{os.getpid()}/{secrets.token_hex(4)}"
        self.key = leases.lock_key(self.token)
        self._conn: psycopg.Connection[Any] | None = psycopg.connect(
            conninfo, autocommit=True, prepare_threshold=None
        )
        self._conn.execute("SELECT pg_advisory_lock(%s)", [self.key])
        row = self._conn.execute(f"SELECT {leases.SERVER_SQL}").fetchone()
        self.server = str(row[0]) if row else ""

    def owner(self) -> tuple[str, int | None, str]:
        return self.token, self.key, self.server

    def die(self) -> None:
        """Close its session; return once the server has let its lock go."""
        if self._conn is None:
            return
        self._conn.close()
        self._conn = None
        deadline = time.monotonic() + 10
        while _lock_held(self.key):
            if time.monotonic() > deadline:
                raise RuntimeError(f"advisory lock {self.key} still held 10 s after closing")
            time.sleep(0.002)


def _lock_held(key: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND ((classid::bigint << 32) | objid::bigint) = %s",
            [key],
        )
        return cursor.fetchone() is not None


@dataclass
class Crash:
    """What `crash_at` did: `fired` once a step reached the point and its worker died."""

    step: str
    point: str
    fired: bool = False
    #: The run and seq whose delivery crashed.
    run_id: str = ""
    seq: int = 0


_crash: Crash | None = None


@contextmanager
def crash_at(where: str, *, must_fire: bool = True) -> Iterator[Crash]:
    """Inside the block, the first attempt of step STEP to reach POINT (`where` is
    "STEP:POINT", as for AGENTFLOW_CRASH_AT) dies there: the worker's liveness lock is freed,
    its open transaction rolls back, and `SimulatedCrash` unwinds the delivery. `run_to_end`
    then redelivers the message, as the broker does after a lost worker, and the run recovers
    the way it would in production (a takeover that asks the partner first, or a republish).

    Called directly, `agentflow._engine.runtime.run_step` raises `SimulatedCrash`. It fires once.
    With
    `must_fire` (the default) a block that ends without the crash fails: a misspelt step name
    would otherwise prove nothing. Needs Postgres (the owner's lock tells a crash apart).
    """
    global _crash
    step, point = _parse_point(where)
    if _crash is not None:
        raise RuntimeError("crash_at blocks do not nest")
    plan = Crash(step=step, point=point)
    worker = _Worker()
    saved_point, saved_owner = faults.crash_point, leases.current_owner

    def owner() -> tuple[str, int | None, str]:
        return worker.owner() if not plan.fired else saved_owner()

    def crash_point(step_name: str, at: str, attempt: int) -> None:
        if plan.fired or attempt != 1 or (step_name, at) != (plan.step, plan.point):
            return
        plan.fired = True
        worker.die()
        raise SimulatedCrash(f"{step_name}:{at}")

    _crash = plan
    faults.crash_point = crash_point  # type: ignore[assignment]
    leases.current_owner = owner  # type: ignore[assignment]
    ended = False
    try:
        yield plan
        ended = True
    finally:
        faults.crash_point = saved_point  # type: ignore[assignment]
        leases.current_owner = saved_owner  # type: ignore[assignment]
        _crash = None
        worker.die()
    if ended and must_fire and not plan.fired:
        raise AssertionError(
            f"crash_at({where!r}) never fired: no first attempt of a step named {step!r} "
            f"reached {point}"
        )


# --- driving a run ------------------------------------------------------------------------------
def next_batch_member(run_id: str) -> int | None:
    """While read-only calls run at once (`agentflow.agent.steps`), the first of them not
    recorded yet: a worker would have its message (the run stays at the batch's first)."""
    run = WorkflowRun.objects.filter(pk=run_id).values_list("current_seq", "batch_last").first()
    span = None if run is None or run[1] is None else (run[0], run[1])
    return _first_unrecorded(run_id, span)


def _first_unrecorded(run_id: str, span: tuple[int, int] | None) -> int | None:
    if span is None:
        return None
    done = set(
        StepCheckpoint.objects.filter(
            run_id=run_id, seq__range=span, status=StepStatus.COMPLETED
        ).values_list("seq", flat=True)
    )
    return next((seq for seq in range(span[0], span[1] + 1) if seq not in done), None)


def _where(run_id: str) -> tuple[Any, ...] | None:
    """What a delivery can change: the run's status and position, its step's checkpoint."""
    run = (
        WorkflowRun.objects.filter(pk=run_id)
        .values_list("status", "current_seq", "current_step", "cancel_requested", "batch_last")
        .first()
    )
    if run is None:
        return None
    checkpoint = (
        StepCheckpoint.objects.filter(run_id=run_id, seq=run[1])
        .values_list("status", "fence", "attempts")
        .first()
    )
    return (*run, checkpoint)


def _let_the_wait_pass(run_id: str) -> None:
    """A run backing off: move its times into the past (by the database's clock) until its
    retry is due, as if the back-off had been waited out."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT EXTRACT(EPOCH FROM (GREATEST(r.wake_at, MAX(c.retry_at)) - now()))"
            f" FROM {WorkflowRun._meta.db_table} r"
            f" LEFT JOIN {StepCheckpoint._meta.db_table} c ON c.run_id = r.id"
            " WHERE r.id = %s GROUP BY r.wake_at",
            [run_id],
        )
        row = cursor.fetchone()
    seconds = float(row[0]) if row and row[0] is not None else 0.0
    if seconds > -0.001:
        aging.runs_age([run_id], seconds=seconds + 0.001)


def _waits_for_someone(run_id: str) -> bool:
    """Waiting for a signal or an approval, its timeout not reached: only a person (or a
    webhook) moves it on, not time (a timer or a retry back-off is waited out); or waiting for
    its concurrency key, which only another run's end frees."""
    held = f"{_concurrency.HOLD}:"
    if WorkflowRun.objects.filter(
        pk=run_id, status=RunStatus.WAITING, hold__startswith=held
    ).exists():
        return True
    if WorkflowRun.objects.filter(pk=run_id, wake_at__lte=Now()).exists():
        return False  # its timeout passed (database clock): the next delivery times it out
    found = durable.snapshot(run_id)
    return found is not None and found.waiting_for in ("signal", "approval")


def _stuck(run_id: str, seq: int) -> str:
    checkpoint = StepCheckpoint.objects.filter(run_id=run_id, seq=seq).first()
    if checkpoint is not None and checkpoint.status == StepStatus.IN_PROGRESS:
        return (
            f"step {seq} {checkpoint.name} is IN_PROGRESS under {checkpoint.lease_owner!r}, "
            "whose lease and liveness lock say it is alive: another worker (or an unfinished "
            "delivery) holds it"
        )
    name = checkpoint.name if checkpoint is not None else "(not started)"
    return f"delivering step {seq} {name} changed nothing"


def _commit_hooks_run() -> AbstractContextManager[Any]:
    """Inside a test's own transaction (a `django_db` test), what the delivery registers to
    run on commit (the next step's message, the `after_complete` crash point) runs as the
    delivery ends, as it would on a real commit. Outside one, commits run them already."""
    if connection.in_atomic_block:
        return TestCase.captureOnCommitCallbacks(execute=True)
    return nullcontext()


def run_to_end(
    run_id: str, *, retries: bool = True, max_deliveries: int = 500
) -> durable.RunSnapshot:
    """Play the worker in this process until the run is finished (COMPLETED, FAILED,
    CANCELLED) or parked (NEEDS_ATTENTION), and return its snapshot. No broker is needed:
    step messages are kept in an outbox (see `capture_messages`) meanwhile.

    `retries`: a run backing off after a retryable error, or sleeping on a timer, is moved on
    in time (by the database's clock) to its retry or wake-up, which then runs; with False, a
    waiting run is returned as it is. A run waiting for a signal or an approval is returned as
    it is (`snapshot.waiting_for` says which): signal, approve or reject it, then call this
    again. Raises AssertionError when a delivery changes nothing (another owner holds the
    step) or after `max_deliveries`. Works in `django_db` and `django_db(transaction=True)`
    tests alike.
    """
    redeliver: int | None = None
    try:
        with capture_messages():
            for _ in range(max_deliveries):
                before = _where(run_id)
                if before is None:
                    raise LookupError(f"there is no workflow run {run_id!r}")
                status, seq = before[0], before[1]
                if redeliver is None:
                    if status not in ACTIVE_RUN_STATUSES:
                        break
                    if status == RunStatus.WAITING:
                        if not retries or _waits_for_someone(run_id):
                            break
                        _let_the_wait_pass(run_id)
                        before = _where(run_id)
                span = None if before is None or before[4] is None else (before[1], before[4])
                seq = _first_unrecorded(run_id, span) or seq
                delivered, redelivered, redeliver = redeliver or seq, redeliver is not None, None
                try:
                    with _commit_hooks_run():
                        runtime.run_step(run_id, delivered, redelivered=redelivered)
                except SimulatedCrash:
                    redeliver = delivered  # acks_late: the broker gives the message back
                    continue
                member_recorded = (
                    before is not None
                    and seq != before[1]
                    and _first_unrecorded(run_id, span) != seq
                )
                if not redelivered and not member_recorded and _where(run_id) == before:
                    raise AssertionError(f"run {run_id} does not move: {_stuck(run_id, seq)}")
            else:
                raise AssertionError(f"run {run_id} still moving after {max_deliveries} deliveries")
    finally:
        leases.release()  # the liveness connection, so the test database can be dropped
    found = durable.snapshot(run_id)
    assert found is not None, f"run {run_id} vanished"
    return found
