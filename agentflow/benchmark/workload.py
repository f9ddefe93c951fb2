"""What the benchmark runs: a no-op Celery task for the plain chain, and no-op workflows."""

from __future__ import annotations

import time
from functools import cache

import redis
from celery import shared_task

from agentflow import durable
from agentflow.celery import app

#: Every workflow of the benchmark has this many steps; the plain chain has as many links.
STEPS = 10
NOOP_TASK = "agentflow.bench_noop"
#: Half read, half effect: the built-in workflow in `agentflow/workflows.py`.
MIXED = "bench"
READ_ONLY = "bench_read"
EFFECT_ONLY = "bench_effect"
#: Finished runs inserted for the sweeper figure; kept between bench runs for reuse.
HISTORY = "bench_history"
#: Runs the sweeper would find due; inserted for one measurement, then deleted.
STALE = "bench_stale"
#: One effect step that holds until released, then a read: the recovery figures kill workers
#: while it holds.
HOLD = "bench_hold"
#: Runs the bench creates and deletes again (HISTORY is kept on purpose).
DISPOSABLE = (MIXED, READ_ONLY, EFFECT_ONLY, STALE, HOLD)


def broker_url() -> str:
    """The broker this process publishes to (a test may have pointed the app elsewhere)."""
    return str(app.conf.broker_write_url or app.conf.broker_url)


def redis_client() -> redis.Redis:
    """The broker's own Redis: the chain's completion counter needs no other server."""
    return _client(broker_url())


@cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


def done_at_key(done_key: str) -> str:
    return f"{done_key}:at"


@shared_task(name=NOOP_TASK, acks_late=True, ignore_result=True)
def noop(done_key: str | None = None, total: int = 0) -> None:
    """One link of a plain chain. The last link counts its chain as done; the link that finishes
    the last chain stamps the time, so the end is measured where it happens, not by a poller."""
    if done_key is None:
        return
    client = redis_client()
    if client.incr(done_key) == total:
        client.set(done_at_key(done_key), repr(time.time()))


def _noop_step(ctx: durable.StepContext) -> None:
    return None


#: Only read steps: one commit each is expected.
read_only = durable.Workflow(READ_ONLY, version=1)
#: Only effect steps: two commits each (claim, then completion) are expected.
effect_only = durable.Workflow(EFFECT_ONLY, version=1)
for _index in range(STEPS):
    read_only.step(f"step_{_index}", kind="read")(_noop_step)
    effect_only.step(f"step_{_index}", kind="effect")(_noop_step)


def release_key(run_id: str) -> str:
    return f"bench:release:{run_id}"


#: Holds at its effect step until the bench sets the release key: an event, not a sleep.
hold = durable.Workflow(HOLD, version=1)


@hold.step("held", kind="effect")
def _held(ctx: durable.StepContext) -> None:
    client = redis_client()
    deadline = time.monotonic() + 120
    while not client.exists(release_key(ctx.run_id)) and time.monotonic() < deadline:
        time.sleep(0.01)


hold.step("after", kind="read")(_noop_step)
