"""CPU time per step, by process, from /proc: on a shared machine steps/s swing with the
neighbours' load, CPU per step much less, and it says where a contender's time goes (its own
processes, or the Postgres backends serving them), which bounds what a ratio can reach on a
machine whose cores they share. Postgres must run on this machine (its backends are read in
/proc); the broker's CPU is left out (a shared Redis serves others too)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connection

from config.bench.throughput import Throughput

_TICKS = os.sysconf("SC_CLK_TCK")


def seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


def backends(dbname: str) -> list[int]:
    """Pids of the Postgres backends connected to `dbname`, but this process's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [dbname],
        )
        return [row[0] for row in cursor.fetchall()]


@dataclass(kw_only=True)
class CpuPerStep:
    """Milliseconds of CPU per step: the contender's own processes, and Postgres."""

    own_ms: float = 0.0
    postgres_ms: float = 0.0
    steps: int = 0

    def add(self, own_s: float, postgres_s: float, steps: int) -> None:
        self.own_ms += own_s * 1000
        self.postgres_ms += postgres_s * 1000
        self.steps += steps

    def as_dict(self) -> dict[str, float]:
        steps = max(self.steps, 1)
        return {
            "own_ms": round(self.own_ms / steps, 3),
            "postgres_ms": round(self.postgres_ms / steps, 3),
            "total_ms": round((self.own_ms + self.postgres_ms) / steps, 3),
        }


@dataclass(kw_only=True)
class CpuMeter:
    """Measures phases of one contender: `own()` lists its processes (read before and after
    each phase), `dbname` the database whose backends serve it."""

    own: Callable[[], list[int]]
    dbname: str
    figure: CpuPerStep = field(default_factory=CpuPerStep)

    def measure(self, phase: Callable[[], Throughput]) -> Throughput:
        own, pg = self._sample()
        result = phase()
        own_after, pg_after = self._sample()
        self.figure.add(
            sum(v - own.get(pid, 0.0) for pid, v in own_after.items()),
            sum(v - pg.get(pid, 0.0) for pid, v in pg_after.items()),
            result.steps,
        )
        return result

    def _sample(self) -> tuple[dict[int, float], dict[int, float]]:
        return (
            {pid: seconds(pid) for pid in self.own()},
            {pid: seconds(pid) for pid in backends(self.dbname)},
        )
