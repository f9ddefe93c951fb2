"""DBOS Transact on the bench's workload, in a process of its own, in the same turns.

DBOS is the closest durable peer (Postgres only, no server): figures measured minutes apart from
ours on a shared machine say little, so the bench drives it turn by turn beside the chain and
agentflow. It runs in a child process (`python -m config.bench.dbos_peer`) with its
own system database on the same server, created and dropped by `DbosPeer`; the child never
loads Django, and the bench process never imports DBOS (it registers global decorators).

One child per mode, each with its own system database: `threads` calls N workflows of `steps`
no-op steps from two threads, `queue` enqueues them on a queue of worker concurrency 2. A child
reads `run N` or `quit` a line on stdin and answers one JSON line on stdout. Between its turns a
child is stopped (SIGSTOP): DBOS polls its queues from a thread of its own, and the 10 ms queue
alone takes a third of a core while idle, which would be taken from whichever contender runs
then. For the same reason the threads child registers no queue: a DBOS user who calls workflows
directly polls none.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

import psycopg
from psycopg import sql

#: DBOS's queue is polled: its default second between polls would cap a queue of
#: concurrency 2 at a few no-op workflows a second. 10 ms is about one such workflow's time.
QUEUE_POLLING_SECONDS = 0.01
THREADS = 2
QUEUE_CONCURRENCY = 2
MODES = ("threads", "queue")


class DbosUnavailable(Exception):
    """DBOS could not be started here (the reason is DBOS's own error)."""


class DbosPeer:
    """The bench's handle on one DBOS child (one mode): its system database, its process, its
    figures."""

    def __init__(self, conninfo: dict[str, Any], *, steps: int, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"DBOS mode {mode!r} is not one of {', '.join(MODES)}")
        #: psycopg connection parameters of the bench's own database; DBOS gets
        #: `<name>_dbos` (threads) or `<name>_dbos_queue`.
        self.conninfo = conninfo
        self.mode = mode
        self.dbname = f"{conninfo['dbname']}_dbos" + ("_queue" if mode == "queue" else "")
        self.steps = steps
        self.process: subprocess.Popen[str] | None = None
        self.version = ""

    def _url(self) -> str:
        info = self.conninfo
        user = info.get("user") or "postgres"
        password = f":{info['password']}" if info.get("password") else ""
        host = info.get("host") or "127.0.0.1"
        port = info.get("port") or 5432
        return f"postgresql://{user}{password}@{host}:{port}/{self.dbname}"

    def _admin(self, statement: sql.Composed) -> None:
        params = {k: v for k, v in self.conninfo.items() if v}
        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute(statement)

    def start(self, *, timeout: float = 60.0) -> DbosPeer:
        name = sql.Identifier(self.dbname)
        self._admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))
        self._admin(sql.SQL("CREATE DATABASE {}").format(name))
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, self._url(), str(self.steps), self.mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "DBOS__APPVERSION": "agentflow-bench"},
        )
        self.version = str(self._answer(timeout)["version"])  # once DBOS has launched
        self._signal(signal.SIGSTOP)
        return self

    def pids(self) -> list[int]:
        return [self.process.pid] if self.process is not None else []

    def run(self, workflows: int, *, timeout: float) -> float:
        """Seconds for `workflows` runs, in the child's mode; stopped again after."""
        assert self.process is not None and self.process.stdin is not None
        self._signal(signal.SIGCONT)
        try:
            self.process.stdin.write(f"run {workflows}\n")
            self.process.stdin.flush()
            return float(self._answer(timeout)["seconds"])
        finally:
            self._signal(signal.SIGSTOP)

    def _signal(self, number: int) -> None:
        """Send `number`; a SIGSTOP returns once the child is stopped (delivery is
        asynchronous, and the next contender's turn must not start beside a running peer)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(number)
        deadline = time.monotonic() + 10
        while number == signal.SIGSTOP and _state(self.process.pid) not in ("T", "Z", ""):
            if time.monotonic() > deadline:
                raise DbosUnavailable(f"the DBOS process {self.process.pid} did not stop")
            time.sleep(0.001)

    def _answer(self, timeout: float) -> dict[str, Any]:
        assert self.process is not None and self.process.stdout is not None
        found: list[str] = []
        reader = threading.Thread(target=lambda: found.append(self.process.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        line = found[0] if found else ""
        if not line:
            self.process.kill()
            error = self.process.stderr.read() if self.process.stderr else ""
            raise DbosUnavailable(
                f"the DBOS process gave no answer within {timeout:.0f} s:\n{error[-3000:]}"
            )
        return dict(json.loads(line))

    def stop(self) -> None:
        if self.process is not None:
            self._signal(signal.SIGCONT)  # a stopped process reads no `quit`
            if self.process.poll() is None:
                try:
                    self.process.communicate("quit\n", timeout=20)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.communicate()
            self.process = None
        name = sql.Identifier(self.dbname)
        self._admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))


def _state(pid: int) -> str:
    """The process's state letter from /proc (T: stopped), or "" once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


# --- the child ---------------------------------------------------------------------------------
def main(url: str, steps: int, mode: str, commands: IO[str], answers: IO[str]) -> None:
    from dbos import DBOS

    DBOS(config={"name": "agentflow_bench", "system_database_url": url, "log_level": "WARNING"})

    @DBOS.step(name="noop")
    def noop() -> None:
        return None

    finished = _Countdown()

    @DBOS.workflow(name="bench")
    def bench() -> None:
        for _ in range(steps):
            noop()
        finished.tick()

    DBOS.launch()
    if mode == "queue":
        queue = DBOS.register_queue(
            "agentflow_bench",
            worker_concurrency=QUEUE_CONCURRENCY,
            polling_interval_sec=QUEUE_POLLING_SECONDS,
        )

    def answer(**fields: Any) -> None:
        answers.write(json.dumps(fields) + "\n")
        answers.flush()

    answer(ready=True, version=_version())
    for line in commands:
        command, _, count = line.strip().partition(" ")
        if command == "quit":
            break
        workflows = int(count)
        finished.expect(workflows)
        started = time.time()
        if mode == "threads":
            with ThreadPoolExecutor(THREADS) as pool:
                list(pool.map(lambda _: bench(), range(workflows)))
            ended = time.time()
        else:
            handles = [queue.enqueue(bench) for _ in range(workflows)]
            # Waited for in memory, not by get_result's polls of the database, which would
            # take the CPU being measured; then timed to the last workflow's recorded end, as
            # agentflow's runs are.
            finished.wait()
            for handle in handles:
                handle.get_result(polling_interval_sec=0.01)
            ended = max(handle.get_status().updated_at or 0 for handle in handles) / 1000
        answer(seconds=ended - started)
    DBOS.destroy()


class _Countdown:
    """Set once the expected number of workflows has returned."""

    def __init__(self) -> None:
        self.left = 0
        self.lock = threading.Lock()
        self.done = threading.Event()

    def expect(self, count: int) -> None:
        self.left = count
        self.done.clear()

    def tick(self) -> None:
        with self.lock:
            self.left -= 1
            if self.left == 0:
                self.done.set()

    def wait(self) -> None:
        self.done.wait()


def _version() -> str:
    from importlib.metadata import version

    return version("dbos")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.stdin, sys.stdout)
