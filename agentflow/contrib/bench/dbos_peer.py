"""DBOS Transact on the bench's workload, in a process of its own, in the same turns.

DBOS is the closest durable peer (Postgres only, no server): figures measured minutes apart from
ours on a shared machine say little, so the bench drives it turn by turn beside the chain and
agentflow. It runs in a child process (`python -m agentflow.contrib.bench.dbos_peer`) with its
own system database on the same server, created and dropped by `DbosPeer`; the child never
loads Django, and the bench process never imports DBOS (it registers global decorators).

The child reads one command a line on stdin (`threads N`, `queue N`, `quit`) and answers one
JSON line on stdout: N workflows of `steps` no-op steps, called from two threads, or enqueued
on a queue of worker concurrency 2.
"""

from __future__ import annotations

import json
import os
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


class DbosUnavailable(Exception):
    """DBOS could not be started here (the reason is DBOS's own error)."""


class DbosPeer:
    """The bench's handle on the DBOS child: its system database, its process, its figures."""

    def __init__(self, conninfo: dict[str, Any], *, steps: int) -> None:
        #: psycopg connection parameters of the bench's own database; DBOS gets `<name>_dbos`.
        self.conninfo = conninfo
        self.dbname = f"{conninfo['dbname']}_dbos"
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
            [sys.executable, "-m", __name__, self._url(), str(self.steps)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "DBOS__APPVERSION": "agentflow-bench"},
        )
        self.version = str(self._answer(timeout)["version"])  # once DBOS has launched
        return self

    def pids(self) -> list[int]:
        return [self.process.pid] if self.process is not None else []

    def run(self, mode: str, workflows: int, *, timeout: float) -> float:
        """Seconds for `workflows` runs in `mode` ("threads" or "queue")."""
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(f"{mode} {workflows}\n")
        self.process.stdin.flush()
        return float(self._answer(timeout)["seconds"])

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
            if self.process.poll() is None:
                try:
                    self.process.communicate("quit\n", timeout=20)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.communicate()
            self.process = None
        name = sql.Identifier(self.dbname)
        self._admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(name))


# --- the child ---------------------------------------------------------------------------------
def main(url: str, steps: int, commands: IO[str], answers: IO[str]) -> None:
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
        mode, _, count = line.strip().partition(" ")
        if mode == "quit":
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
    main(sys.argv[1], int(sys.argv[2]), sys.stdin, sys.stdout)
