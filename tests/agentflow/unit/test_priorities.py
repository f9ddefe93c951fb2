"""Priorities on each broker's scale, and concurrency keys as declared and stored
(agentflow._priority, agentflow._concurrency): pure rules, table-driven."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from agentflow import _concurrency, _priority
from agentflow.exceptions import DefinitionError, InvalidInputError


@pytest.mark.parametrize(
    ("value", "refused"),
    [
        (None, False),
        (0, False),
        (9, False),
        (5, False),
        (-1, True),
        (10, True),
        (True, True),
        (2.0, True),
        ("3", True),
    ],
)
def test_priority__zero_to_nine_or_none(value: object, refused: bool) -> None:
    assert bool(_priority.problem(value)) is refused
    if refused:
        with pytest.raises(InvalidInputError):
            _priority.given(value)
        with pytest.raises(DefinitionError, match="'w'"):
            _priority.declared("w", value)


@pytest.mark.parametrize(
    ("driver", "priority", "on_message"),
    [
        ("redis", 9, 0),
        ("redis", 0, 9),
        ("redis", 7, 2),
        ("amqp", 9, 9),
        ("amqp", 0, 0),
        ("filesystem", 4, 4),
    ],
)
def test_on_message__redis_reads_low_first_rabbitmq_high_first(
    driver: str, priority: int, on_message: int
) -> None:
    connection = SimpleNamespace(transport=SimpleNamespace(driver_type=driver))
    assert _priority.on_message(connection, priority) == on_message


def _app(url: str, **conf: Any) -> Celery:
    app = Celery(set_as_current=False)
    app.conf.update(broker_url=url, **conf)
    return app


@pytest.fixture
def _own_broker_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Celery reads CELERY_BROKER_URL (the suite's) before an app's own setting."""
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)


@pytest.mark.parametrize(
    ("app", "says"),
    [
        (_app("amqp://h//"), "x-max-priority"),
        (_app("amqp://h//", task_queue_max_priority=5), "count as 5"),
        (_app("amqp://h//", task_queue_max_priority=9), ""),
        (_app("redis://h/0"), "[0, 3, 6, 9]"),
        (_app("redis://h/0", broker_transport_options={"priority_steps": [0, 5]}), "[0, 5]"),
        (_app("redis://h/0", broker_transport_options={"priority_steps": list(range(10))}), ""),
        (_app("filesystem://"), ""),
    ],
)
@pytest.mark.usefixtures("_own_broker_urls")
def test_config_problems__what_each_broker_needs(app: Celery, says: str) -> None:
    problems = _priority.config_problems(app)
    assert (says in " ".join(problems)) if says else problems == []


@pytest.mark.parametrize(
    ("key", "limit", "result"),
    [
        (None, None, None),
        (len, None, 1),
        (len, 3, 3),
        (None, 2, DefinitionError),
        ("booking", 1, DefinitionError),
        (len, 0, DefinitionError),
        (len, True, DefinitionError),
    ],
)
def test_concurrency_declared__a_key_function_and_a_cap_of_at_least_one(
    key: Any, limit: Any, result: Any
) -> None:
    if result is DefinitionError:
        with pytest.raises(DefinitionError):
            _concurrency.declared("w", key, limit)
    else:
        assert _concurrency.declared("w", key, limit) == result


@pytest.mark.parametrize(
    "function", [lambda i: i["missing"], lambda i: "", lambda i: 42, lambda i: "x" * 1001]
)
def test_key_of__a_key_that_cannot_be_read_is_invalid_input(function: Any) -> None:
    with pytest.raises(InvalidInputError, match="concurrency key"):
        _concurrency.key_of("w", function, {"booking": "ABC123"})


def test_digest__same_key_same_digest_never_the_key_in_clear(settings: Any) -> None:
    one = _concurrency.digest("refund", "ABC123")
    assert one == _concurrency.digest("refund", "ABC123") and len(one) == 64
    assert "ABC123" not in one
    assert one != _concurrency.digest("refund", "ABC124")
    assert one != _concurrency.digest("other", "ABC123")  # a key is the workflow's own
    settings.SECRET_KEY = "another secret key for this test, long enough to be one"
    assert _concurrency.digest("refund", "ABC123") != one
