"""The chaos monkey: SIGKILLs pool children, whole workers, the broker and the database server,
and says what it hit.

Every kill records the moment, the pids, and the steps that were IN_PROGRESS under a lease held
by one of those pids (for the database: every step IN_PROGRESS; for the broker, the step
messages it held), so the report can time how long the engine took to finish each of them.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections

from agentflow._base.states import StepStatus
from agentflow.models import StepCheckpoint
from agentflow.testing.processes import PostgresServer, WorkerProcess
from refunds.chaos.processes import RabbitBroker, RedisBroker

CHILD, WORKER, BROKER, POSTGRES = "child", "worker", "broker", "postgres"
#: How long the database stays down after each crash before it starts again (then crash
#: recovery): long enough that workers meet refused connections, not only reset ones.
POSTGRES_DOWN_SECONDS = 2.0
POSTGRES_BUSY_WAIT_SECONDS = 10.0
#: How long a kill may wait for a victim that is in the middle of a step: killing an idle
#: process proves little, but the moment within the step stays random.
BUSY_WAIT_SECONDS = 2.0


@dataclass(frozen=True, kw_only=True)
class LeasedStep:
    run_id: str
    seq: int
    name: str
    attempts: int


@dataclass(kw_only=True)
class Kill:
    kind: str
    at: float
    pids: list[int]
    worker: str = ""
    #: Steps IN_PROGRESS under a lease owned by a killed pid, just before the kill.
    leased: list[LeasedStep] = field(default_factory=list)
    #: Broker restarts: (run id, seq) of the step messages the broker held (now lost).
    lost_messages: list[tuple[str, int]] = field(default_factory=list)
    replacement: str = ""

    def as_json(self, t0: float) -> dict[str, Any]:
        data: dict[str, Any] = {
            "at_seconds": round(self.at - t0, 3),
            "kind": self.kind,
            "pids": self.pids,
            "in_progress_steps": [f"{s.run_id}#{s.seq} {s.name}" for s in self.leased],
        }
        if self.worker:
            data["worker"] = self.worker
        if self.kind == BROKER:
            data["lost_messages"] = len(self.lost_messages)
        if self.replacement:
            data["replacement"] = self.replacement
        return data


def owner_pid(owner: str) -> int | None:
    """The pid in a lease owner `host/pid/start`, if the owner is on this host."""
    parts = owner.split("/")
    if len(parts) != 3 or parts[0] != settings.AGENTFLOW_HOSTNAME:
        return None
    try:
        return int(parts[1])
    except ValueError:
        return None


def leased_steps() -> dict[int, list[LeasedStep]]:
    """IN_PROGRESS steps by the pid that holds their lease (none while the database is down)."""
    found: dict[int, list[LeasedStep]] = {}
    try:
        rows = list(
            StepCheckpoint.objects.filter(status=StepStatus.IN_PROGRESS).values_list(
                "run_id", "seq", "name", "attempts", "lease_owner"
            )
        )
    except DatabaseError:
        connections.close_all()  # a restart killed our connection: the next call opens one
        return found
    for run_id, seq, name, attempts, owner in rows:
        pid = owner_pid(owner)
        if pid is not None:
            found.setdefault(pid, []).append(
                LeasedStep(run_id=run_id, seq=seq, name=name, attempts=attempts)
            )
    return found


class WorkerPool:
    """The run's workers; a whole-worker kill is followed by a fresh worker in its place."""

    def __init__(self, *, env: dict[str, str], count: int, concurrency: int, log_dir: Path) -> None:
        self.env, self.concurrency, self.log_dir = env, concurrency, log_dir
        self.count = count
        self.workers: list[WorkerProcess] = []
        self.every: list[WorkerProcess] = []  # including dead ones: all are killed at the end
        self._serial = 0
        self._lock = threading.Lock()
        self._booting: list[threading.Thread] = []

    def _new(self) -> WorkerProcess:
        self._serial += 1
        worker = WorkerProcess(
            concurrency=self.concurrency,
            env=self.env,
            name=f"chaos{self._serial}",
            log_dir=self.log_dir,
        )
        self.every.append(worker)
        return worker

    def start(self) -> None:
        """Start them side by side: a Celery worker takes seconds to boot on a small machine."""
        fresh = [self._new() for _ in range(self.count)]
        errors: list[BaseException] = []

        def boot(worker: WorkerProcess) -> None:
            try:
                worker.start(timeout=90)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=boot, args=(w,)) for w in fresh]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        self.workers = fresh

    def replace(self, dead: WorkerProcess) -> str:
        """Start a fresh worker in the background (booting takes seconds; traffic and other
        kills go on meanwhile); it joins the pool once ready. Returns its name."""
        worker = self._new()
        with self._lock:
            self.workers = [w for w in self.workers if w is not dead]

        def boot() -> None:
            try:
                worker.start(timeout=90)
            except Exception:
                return  # killed by kill_all while booting, or broken: its log says which
            with self._lock:
                self.workers.append(worker)

        thread = threading.Thread(target=boot, name=f"boot-{worker.name}", daemon=True)
        self._booting.append(thread)
        thread.start()
        return worker.name

    def alive(self) -> list[WorkerProcess]:
        with self._lock:
            return [w for w in self.workers if w.alive()]

    def kill_all(self) -> None:
        """Kill every worker ever started; those still booting are killed once they exist."""
        for worker in self.every:
            worker.kill()
        for thread in self._booting:
            thread.join()
        for worker in self.every:
            worker.kill()


class Monkey:
    """Carries out kills chosen by a seeded RNG; the plan is shuffled once, up front."""

    def __init__(
        self,
        *,
        rng: random.Random,
        pool: WorkerPool,
        broker: RedisBroker | RabbitBroker | None,
        postgres: PostgresServer | None = None,
    ) -> None:
        self.rng, self.pool, self.broker, self.postgres = rng, pool, broker, postgres
        self.kills: list[Kill] = []

    def plan(
        self, *, children: int, workers: int, broker_restarts: int, postgres_restarts: int = 0
    ) -> list[str]:
        """Shuffled, but with the broker and database restarts and one worker kill in the first
        half, so a run that drains early still shows them."""
        rest = [CHILD] * children + [WORKER] * max(0, workers - 1)
        self.rng.shuffle(rest)
        early = [WORKER] * min(1, workers) + [BROKER] * broker_restarts
        early += [POSTGRES] * postgres_restarts
        self.rng.shuffle(early)
        for kind in early:
            rest.insert(self.rng.randint(0, len(rest) // 2), kind)
        return rest

    def act(self, kind: str) -> Kill | None:
        kill = {
            CHILD: self._kill_child,
            WORKER: self._kill_worker,
            BROKER: self._restart_broker,
            POSTGRES: self._restart_postgres,
        }[kind]()
        if kill is not None:
            self.kills.append(kill)
        return kill

    def _busy_pids(self, wait: float = BUSY_WAIT_SECONDS) -> dict[int, list[LeasedStep]]:
        deadline = time.monotonic() + wait
        while True:
            leased = leased_steps()
            if leased or time.monotonic() > deadline:
                return leased
            time.sleep(0.05)

    def _kill_child(self) -> Kill | None:
        leased = self._busy_pids()
        candidates = [(w, pid) for w in self.pool.alive() for pid in w.children()]
        if not candidates:
            return None
        busy = [(w, pid) for w, pid in candidates if pid in leased]
        worker, pid = self.rng.choice(busy or candidates)
        leased = leased_steps()  # as close to the kill as we can read it
        at = time.time()
        worker.kill_child(pid)
        return Kill(kind=CHILD, at=at, pids=[pid], worker=worker.name, leased=leased.get(pid, []))

    def _kill_worker(self) -> Kill | None:
        leased = self._busy_pids()
        alive = self.pool.alive()
        if not alive:
            return None
        busy = [w for w in alive if any(pid in leased for pid in w.children())]
        worker = self.rng.choice(busy or alive)
        pids = [worker.pid, *worker.children()]
        leased = leased_steps()
        at = time.time()
        worker.kill()
        kill = Kill(
            kind=WORKER,
            at=at,
            pids=pids,
            worker=worker.name,
            leased=[step for pid in pids for step in leased.get(pid, [])],
        )
        kill.replacement = self.pool.replace(worker)
        return kill

    def _restart_broker(self) -> Kill | None:
        if self.broker is None or self.broker.proc is None:
            return None
        lost = self.broker.queued_steps()
        pid = self.broker.proc.pid
        at = time.time()
        self.broker.restart()
        return Kill(kind=BROKER, at=at, pids=[pid], lost_messages=lost)

    def _restart_postgres(self) -> Kill | None:
        """Crash the database server while steps are in flight, keep it down a moment, start
        it again (crash recovery): every connection of every process dies at once."""
        if self.postgres is None or self.postgres.proc is None:
            return None
        # Longer than for a process kill: a database restart while nothing is in flight proves
        # little, and the run is still sending refunds when the first restart comes.
        leased = self._busy_pids(wait=POSTGRES_BUSY_WAIT_SECONDS)
        pid = self.postgres.postmaster_pid
        at = time.time()
        self.postgres.crash()
        time.sleep(POSTGRES_DOWN_SECONDS)  # the outage itself, not a wait for an event
        self.postgres.start()
        return Kill(
            kind=POSTGRES, at=at, pids=[pid], leased=[s for steps in leased.values() for s in steps]
        )
