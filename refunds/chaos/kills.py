"""The chaos monkey: SIGKILLs pool children, whole workers and the broker, and says what it hit.

Every kill records the moment, the pids, and the steps that were IN_PROGRESS under a lease held
by one of those pids (or, for the broker, the step messages it held), so the report can time
how long the engine took to finish each of them.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from agentflow.models import StepCheckpoint
from agentflow.states import StepStatus
from agentflow.workers import WorkerProcess
from refunds.chaos.processes import RedisBroker

CHILD, WORKER, BROKER = "child", "worker", "broker"
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
    """IN_PROGRESS steps by the pid that holds their lease."""
    found: dict[int, list[LeasedStep]] = {}
    rows = StepCheckpoint.objects.filter(status=StepStatus.IN_PROGRESS).values_list(
        "run_id", "seq", "name", "attempts", "lease_owner"
    )
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

    def __init__(self, *, rng: random.Random, pool: WorkerPool, broker: RedisBroker | None) -> None:
        self.rng, self.pool, self.broker = rng, pool, broker
        self.kills: list[Kill] = []

    def plan(self, *, children: int, workers: int, broker_restarts: int) -> list[str]:
        """Shuffled, but with the broker restart and one worker kill in the first half, so a
        run that drains early still shows them."""
        rest = [CHILD] * children + [WORKER] * max(0, workers - 1)
        self.rng.shuffle(rest)
        early = [WORKER] * min(1, workers) + [BROKER] * broker_restarts
        self.rng.shuffle(early)
        for kind in early:
            rest.insert(self.rng.randint(0, len(rest) // 2), kind)
        return rest

    def act(self, kind: str) -> Kill | None:
        kill = {CHILD: self._kill_child, WORKER: self._kill_worker, BROKER: self._restart_broker}[
            kind
        ]()
        if kill is not None:
            self.kills.append(kill)
        return kill

    def _busy_pids(self) -> dict[int, list[LeasedStep]]:
        deadline = time.monotonic() + BUSY_WAIT_SECONDS
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
