"""What the benchmark runs: no-op Celery tasks for the plain and the hand-written durable chain,
and no-op workflows."""

from __future__ import annotations

import time
from functools import cache

import redis
from celery import current_app as app
from celery import shared_task

from agentflow import durable
from config.bench import synthetic

#: Every workflow of the benchmark has this many steps; the plain chain has as many links.
STEPS = 10
NOOP_TASK = "agentflow.bench_noop"
#: Half read, half effect: what `manage.py bench` measures.
MIXED = "bench"
READ_ONLY = "bench_read"
EFFECT_ONLY = "bench_effect"
#: A read, then an effect: the run whose path `step_path` maps.
READ_THEN_EFFECT = "bench_read_effect"
#: Finished runs inserted for the sweeper figure; kept between bench runs for reuse.
HISTORY = "bench_history"
#: Runs the sweeper would find due; inserted for one measurement, then deleted.
STALE = "bench_stale"
#: One effect step that holds until released, then a read: the recovery figures kill workers
#: while it holds.
HOLD = "bench_hold"
#: The hand-written durable chain's runs: a row per chain, a checkpoint row per link.
NAIVE = "bench_naive"
NAIVE_TASK = "agentflow.bench_naive"
#: The protocol floor's runs: the writes a step needs and nothing else, on a plain chain.
FLOOR = "bench_floor"
FLOOR_TASK = "agentflow.bench_floor"
#: Finished runs dated long ago, with their checkpoints and events, for the purge to delete.
AGED = "bench_aged"
#: One effect step calling a limited partner: the partner-limit figure (issue 27).
LIMITED = "bench_limited"
#: Runs the bench creates and deletes again (HISTORY is kept on purpose).
DISPOSABLE = (MIXED, READ_ONLY, EFFECT_ONLY, STALE, HOLD, NAIVE, FLOOR, AGED, LIMITED)


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
    """One link of a plain chain; the last link counts its chain as done."""
    if done_key is not None:
        _count_chain_done(done_key, total)


def _count_chain_done(done_key: str, total: int) -> None:
    """The link that finishes the last chain stamps the time, so the end is measured where it
    happens, not by a poller."""
    client = redis_client()
    if client.incr(done_key) == total:
        client.set(done_at_key(done_key), repr(time.time()))


@shared_task(name=NAIVE_TASK, acks_late=True, ignore_result=True)
def naive_link(run_id: str, seq: int, done_key: str | None = None, total: int = 0) -> None:
    """One link of a durable chain written by hand, the yardstick agentflow should not be slower
    than: two plain ORM commits per task (record the step, then advance the run), and none of
    the claim, fencing, lease, retry or recovery that make agentflow safe."""
    synthetic.yardstick_step_record(run_id, seq)
    if done_key is not None:
        _count_chain_done(done_key, total)


@shared_task(name=FLOOR_TASK, acks_late=True, ignore_result=True)
def floor_link(run_id: str, seq: int, done_key: str | None = None, total: int = 0) -> None:
    """One link of the protocol floor: a plain chain task that makes exactly the writes the
    protocol requires of the mixed workflow's step at `seq` (odd: read, even: effect): the
    rate an engine keeping the protocol's guarantees can reach here with the store's
    statements."""
    synthetic.floor_step(run_id, seq, effect=seq % 2 == 0, last=seq == STEPS)
    if done_key is not None:
        _count_chain_done(done_key, total)


def _noop_step(ctx: durable.StepContext) -> None:
    return None


#: Ten no-op steps, alternating read and effect.
mixed = durable.Workflow(MIXED, version=1)
#: Only read steps: one commit each is expected.
read_only = durable.Workflow(READ_ONLY, version=1)
#: Only effect steps: two commits each (claim, then completion) are expected.
effect_only = durable.Workflow(EFFECT_ONLY, version=1)
read_then_effect = durable.Workflow(READ_THEN_EFFECT, version=1)
read_then_effect.step("read", kind="read")(_noop_step)
read_then_effect.step("effect", kind="effect")(_noop_step)
for _index in range(STEPS):
    mixed.step(f"step_{_index}", kind="read" if _index % 2 == 0 else "effect")(_noop_step)
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
