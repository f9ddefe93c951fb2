"""Publishing step messages on the real brokers: the first publish on a connection declares the
step queue (on RabbitMQ a message to an undeclared queue is dropped), and later ones skip the
declaration kombu has already recorded for that connection, without losing a message."""

from __future__ import annotations

from typing import Any

import pytest
from celery import current_app
from kombu import Connection

from agentflow._core import dispatch
from agentflow.testing.processes import RedisServer, publishing_to
from agentflow.testing.waiting import wait_for

QUEUE = "celery"


def _drop_queue(url: str) -> None:
    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        try:
            channel.queue_delete(QUEUE)
        except Exception as exc:  # RabbitMQ: NOT_FOUND when it does not exist yet
            if "NOT_FOUND" not in str(exc):
                raise
        finally:
            channel.close()


@pytest.mark.parametrize("infra", ["redis", "rabbitmq"], indirect=True)
def test_send_step__declares_once_per_connection_and_every_message_arrives(
    broker: Any, infra: str
) -> None:
    _drop_queue(broker.url)  # as on a broker no worker has declared anything on yet
    app = current_app._get_current_object()
    route = dispatch._route(app)
    with app.producer_or_acquire() as producer:
        assert not dispatch._declared(producer, route)

    assert dispatch.send_step("wf_dispatch", 1)  # declares the queue, then publishes
    with app.producer_or_acquire() as producer:
        assert dispatch._declared(producer, route)
    assert dispatch.send_step("wf_dispatch", 2)  # the cache says declared: no declaration

    # RabbitMQ routes a publish after it is sent: count once both are there, then again.
    wait_for(lambda: broker.queue_length(QUEUE) >= 2, timeout=10, what="both messages queued")
    assert broker.queue_length(QUEUE) == 2


def test_publishing_to__a_private_broker_and_back__every_publish_arrives(
    redis_server: RedisServer,
) -> None:
    """Chaos and the crash tests point this process at a private broker and back. Closing a
    pool kombu still hands out made every later publish fail ("Acquire on closed pool") and
    left a test's run waiting for a sweeper it had not started."""
    home = current_app.conf.broker_write_url
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    private = redis_server.client()
    private.flushall()
    assert dispatch.send_step("wf_before", 1)  # the home broker's pools exist before the switch

    with publishing_to(redis_server.url):
        assert dispatch.send_step("wf_private", 1)
        assert private.llen(QUEUE) == 1

    assert current_app.conf.broker_write_url == home
    with Connection(home, connect_timeout=5) as conn:
        before = conn.default_channel.client.llen(QUEUE)
    assert dispatch.send_step("wf_after", 1)  # the home broker's pool was not left closed
    with Connection(home, connect_timeout=5) as conn:
        assert conn.default_channel.client.llen(QUEUE) == before + 1
    assert private.llen(QUEUE) == 1
