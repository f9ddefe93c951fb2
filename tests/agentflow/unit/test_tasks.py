"""The worker's timer does not keep finished tasks' time limits: the prefork pool arms one per
task in the worker's parent (a step's soft limit is 240 s), and kombu's timer keeps a cancelled
entry until it falls due, so the parent held every task of the last four minutes."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from celery.concurrency.asynpool import AsynPool
from kombu.asynchronous import Hub

from agentflow._engine import tasks


@pytest.fixture
def hub() -> Iterator[Hub]:
    hub = Hub()
    yield hub
    hub.close()


def time_limits(hub: Hub) -> AsynPool:
    """The prefork pool's own time-limit handlers on `hub`, as a worker arms them (nothing
    else of the pool is needed, so no process is started)."""
    pool = AsynPool.__new__(AsynPool)
    pool._create_timelimit_handlers(hub)
    return pool


def run_tasks(pool: AsynPool, jobs: range, *, finish: bool) -> None:
    for job in jobs:
        task = SimpleNamespace(_job=job)
        pool.on_timeout_set(task, tasks.STEP_SOFT_TIME_LIMIT + job % 7, tasks.STEP_TIME_LIMIT)
        if finish:
            pool.on_timeout_cancel(task)


def limits_of(hub: Hub) -> list[int]:
    """The jobs whose time limits the timer holds, cancelled or not, in the order they fall due."""
    entries = [item.entry for item in hub.timer.queue]
    return [entry.args[0] for entry in entries if entry.fun.__name__ == "_on_soft_timeout"]


def test_drop_cancelled__keeps_only_running_tasks_limits_in_due_order(hub: Hub) -> None:
    pool = time_limits(hub)
    run_tasks(pool, range(1000), finish=True)
    run_tasks(pool, range(1000, 1010), finish=False)  # still running
    assert len(hub.timer) == 1010  # kombu keeps the finished ones: what the sweep is for

    tasks.drop_cancelled(hub.timer)

    running = sorted(range(1000, 1010), key=lambda job: (job % 7, job))
    assert limits_of(hub) == running  # the heap still pops in due order
    assert len(hub.timer) == 10


def test_worker_ready__arms_a_sweep_that_drops_finished_tasks_limits(hub: Hub) -> None:
    tasks._forget_finished_time_limits(sender=SimpleNamespace(controller=SimpleNamespace(hub=hub)))
    [armed] = list(hub.timer._queue)
    pool = time_limits(hub)
    run_tasks(pool, range(500), finish=True)
    run_tasks(pool, range(500, 502), finish=False)

    armed.entry()  # what the event loop does when the sweep falls due

    assert limits_of(hub) == [500, 501]
    assert all(not item.entry.canceled for item in hub.timer._queue)
