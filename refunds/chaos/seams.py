"""Where the model-based test (`refunds.chaos.model`) takes the controls of one process: the
broker, the worker processes, the crash points and the model.

Each seam is the engine's own public point, replaced for the length of a `Seams` block:
- publishing (`dispatch.send_step`) puts step messages on a queue the machine delivers from,
  in any order, twice or never;
- each simulated worker has its own owner token and holds its own advisory lock on its own
  connection (docs/protocol.md, "Liveness"), so a worker that "dies" is dead to the database exactly
  as after a SIGKILL: its lock is free, its committed claims stay, its uncommitted work is rolled
  back;
- the crash points of docs/protocol.md, "Crash points" (`faults.crash_point`) crash or pause the
  delivery armed for them;
- the refund agent's scripted model answers as the machine says (the usual plan, reordered,
  a call repeated, a call the engine must refuse) and can be redeployed under a new name.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.db import connection
from django.test.utils import override_settings

from agentflow._core import dispatch, faults, leases
from agentflow.agent import ModelRequest, Plan, ScriptedModel, call
from refunds import gateways
from refunds.agent import planner
from refunds.agent.prompts import read_first_user_message
from refunds.agent.workflow import refund_agent
from refunds.chaos.evidence import claim_mark

#: Long enough that no lease runs out and no renewal is due by the wall clock while an example
#: runs: time passes only when the machine says so (`agentflow._store.aging.runs_age`).
LEASE_SECONDS = 3600
MODEL_ANSWERS = ("usual", "reordered", "repeated", "refused")


class SimulatedCrash(BaseException):
    """The simulated worker died here. A BaseException, like the SIGKILL it stands for: no
    `except Exception` of the engine's may catch it; every open transaction rolls back."""


@dataclass
class Message:
    run_id: str
    seq: int
    fresh: dispatch.Fresh | None = None
    redelivered: bool = False
    #: A build's own queue (None: the shared one).
    queue: str | None = None

    def redelivery(self) -> Message:
        """The same message given back by the broker after its consumer died."""
        return Message(
            run_id=self.run_id, seq=self.seq, fresh=self.fresh, redelivered=True, queue=self.queue
        )


class Worker:
    """One simulated worker process: an owner token and the advisory lock that is its life."""

    def __init__(self, name: str, conninfo: str) -> None:
        self.token = f"model/{name}/{secrets.token_hex(4)}"
        self.key = leases.lock_key(self.token)
        self._conn: psycopg.Connection[Any] | None = psycopg.connect(conninfo, autocommit=True)
        self._conn.execute("SELECT pg_advisory_lock(%s)", [self.key])
        # The server the lock is held on, as a real worker's liveness records it
        # (docs/protocol.md, "Liveness").
        row = self._conn.execute(f"SELECT {leases.SERVER_SQL}").fetchone()
        self.server = row[0] if row else ""

    @property
    def alive(self) -> bool:
        return self._conn is not None

    def die(self) -> None:
        """Its session ends, so Postgres frees its lock: every claim it holds looks abandoned.
        Returns once the server has let the lock go (a backend takes a moment to exit), so
        that what the next rule sees does not depend on timing."""
        if self._conn is None:
            return
        self._conn.close()
        self._conn = None
        deadline = time.monotonic() + 10
        while _lock_held(self.key) and time.monotonic() < deadline:
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
class PointPlan:
    """What one delivery does at the crash points: nothing, crash at `point`, or pause there."""

    point: str | None = None
    pause: bool = False
    paused: threading.Event = field(default_factory=threading.Event)
    go_on: threading.Event = field(default_factory=threading.Event)
    die: bool = False
    #: The (step name, point) it stopped at, once it did.
    stopped_at: tuple[str, str] | None = None


class Paused:
    """A delivery stopped at a crash point in its own thread: a stale worker, until it wakes."""

    def __init__(self, message: Message, worker: Worker, plan: PointPlan, thread: Any) -> None:
        self.message, self.worker, self.plan, self.thread = message, worker, plan, thread
        #: The claim it holds (row and fence): if that changes, it has been fenced out.
        self.mark = claim_mark(message.run_id, message.seq)


class Seams:
    """The controls, taken in `with Seams() as seams:` and given back at its end."""

    def __init__(self) -> None:
        self.queue: list[Message] = []
        self.answers: dict[str, str] = {}  # refund id -> how the model answers its turns
        self.model_generation = 0
        self._local = threading.local()
        self._model = ScriptedModel(planner.MODEL, self._plan)

    # --- the seams ------------------------------------------------------------------------
    def _send_step(
        self,
        run_id: str,
        seq: int,
        *,
        countdown: float | None = None,
        fresh: Any = None,
        queue: str | None = None,
        priority: Any = None,
    ) -> bool:
        self.queue.append(Message(run_id=run_id, seq=seq, fresh=fresh, queue=queue))
        return True

    def _current_owner(self) -> tuple[str, int | None, str]:
        worker: Worker = self._local.worker
        return worker.token, worker.key, worker.server

    def _crash_point(self, step: str, point: str, attempt: int) -> None:
        plan: PointPlan | None = getattr(self._local, "plan", None)
        if plan is None or plan.point != point or plan.stopped_at is not None:
            return
        if plan.pause and connection.in_atomic_block:
            return  # a pause holding row locks would stop the machine itself: not here
        plan.stopped_at = (step, point)
        if plan.pause:
            plan.paused.set()
            plan.go_on.wait()
            if not plan.die:
                return
        raise SimulatedCrash(f"{step}:{point}")

    def _plan(self, request: ModelRequest) -> Plan:
        refund_id = read_first_user_message(
            next(m for m in request.messages if m.get("role") == "user")["content"]
        )[0]
        usual = planner.plan_refund(request)
        how = self.answers.get(refund_id, "usual")
        if how == "usual" or not usual.calls:
            return usual
        if how == "reordered":
            return Plan(calls=tuple(reversed(usual.calls)))
        if how == "repeated":
            return Plan(calls=(*usual.calls, usual.calls[-1]))
        # refused: a fee the tools must not take (not the policy's), asked along the usual calls
        return Plan(
            calls=(*usual.calls, call("charge_customer", refund_id=refund_id, amount_cents=1))
        )

    def reset(self) -> None:
        """As at the start: nothing queued, every model answer the usual, the first model."""
        self.queue.clear()
        self.answers.clear()
        self.model_generation = 0
        self._model.model = planner.MODEL

    def redeploy_model(self) -> None:
        """A new model version: recorded turns no longer match, so replays diverge."""
        self.model_generation += 1
        self._model.model = f"{planner.MODEL}+{self.model_generation}"

    # --- running one delivery -------------------------------------------------------------
    def run_as(self, worker: Worker, plan: PointPlan | None, work: Callable[[], None]) -> None:
        self._local.worker, self._local.plan = worker, plan
        try:
            work()
        finally:
            self._local.worker = self._local.plan = None

    # --- taking and giving back -----------------------------------------------------------
    @contextmanager
    def taken(self, partners: dict[str, Any]) -> Iterator[Seams]:
        with ExitStack() as stack:
            stack.enter_context(
                override_settings(
                    AGENTFLOW_LEASE_SECONDS=LEASE_SECONDS,
                    AGENTFLOW_LLM_BASE_URL="",
                    REFUNDS_SUBMIT_LIMIT=0,
                    REFUNDS_BOOKING_LIMIT=0,
                    **partners,
                )
            )
            for owner, name, value in (
                (dispatch, "send_step", self._send_step),
                (leases, "current_owner", self._current_owner),
                (faults, "crash_point", self._crash_point),
                # Every back-off gets its doorbell, whatever its jitter drew: what is queued
                # must not depend on chance, or a failure would not replay.
                (dispatch, "MAX_COUNTDOWN_SECONDS", float("inf")),
                (refund_agent, "model", self._model),
                # "Applied, then the answer lost" means lost: no client-side replay hides it.
                (gateways, "STRIPE_NETWORK_RETRIES", 0),
            ):
                stack.enter_context(_replaced(owner, name, value))
            gateways._stripe_client.cache_clear()
            stack.callback(gateways._stripe_client.cache_clear)
            yield self


@contextmanager
def _replaced(owner: Any, name: str, value: Any) -> Iterator[None]:
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)
