"""`chaos` points this process's Celery app at its own broker and back (`publishing_to`): the
app's pools work again afterwards, so a run the form starts after a chaos run is enqueued
(kombu keeps each URL's pool in its registry; one only closed was handed back, and every
enqueue failed with "Acquire on closed pool" until a sweeper came by)."""

from __future__ import annotations

from celery import current_app as app

from refunds.chaos.processes import publishing_to


def test_publishing_to__the_app_s_pools_work_on_the_way_home() -> None:
    before = app.pool
    before.acquire(block=False).release()

    with publishing_to("redis://127.0.0.1:1/0"):  # never connected: pools are lazy
        app.pool.acquire(block=False).release()

    connection = app.pool.acquire(block=False)  # raised RuntimeError: Acquire on closed pool
    connection.release()
    with app.producer_or_acquire() as producer:
        assert producer is not None
