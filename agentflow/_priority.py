"""A run's priority as each broker orders it: one scale for workflows, two for the brokers.

A priority is an integer from 0 to 9, higher taken first (docs/workflows.md, "Priorities"). It is
kept on the run and put on each of its step messages (`agentflow._core.dispatch`), so a message the
sweeper, an operator or a partner's turn publishes again goes with the same priority. The brokers
count differently: RabbitMQ takes the highest first (a queue declared with `x-max-priority`), and
kombu's Redis transport the lowest (a list per step of `priority_steps`, 0 read first), so the
value put on a message is this one on RabbitMQ and `9 - priority` on Redis. A run without a
priority goes without one, exactly as before priorities existed.
"""

from __future__ import annotations

import enum
from typing import Any

from agentflow.exceptions import DefinitionError, InvalidInputError

LOWEST = 0
HIGHEST = 9


class _OfRun(enum.Enum):
    OF_RUN = "of the run"


#: `send_step`'s default: the run's own priority, read from its row when the caller has not
#: loaded it (the step's own path passes the priority it loaded, and reads nothing more).
OF_RUN = _OfRun.OF_RUN
Priority = int | None | _OfRun


def problem(value: object) -> str:
    """Why `value` is no priority (empty: it is one, or None)."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, int) or not LOWEST <= value <= HIGHEST:
        return f"a priority is an integer from {LOWEST} to {HIGHEST} (higher first), not {value!r}"
    return ""


def declared(workflow: str, value: object) -> int | None:
    """A workflow's declared priority, or a DefinitionError."""
    refused = problem(value)
    if refused:
        raise DefinitionError(f"workflow {workflow!r}: {refused}")
    return value  # type: ignore[return-value]


def given(value: object) -> int | None:
    """A priority given to one start, or an InvalidInputError."""
    refused = problem(value)
    if refused:
        raise InvalidInputError(refused)
    return value  # type: ignore[return-value]


# --- what the broker is given --------------------------------------------------------------------
REVERSED_TRANSPORTS = frozenset({"redis", "rediss", "sentinel"})
ORDERED_TRANSPORTS = frozenset({"amqp", "pyamqp", "amqps", "librabbitmq"})


def transport(app: Any) -> str:
    """The broker's transport name as kombu reads the URL (`redis`, `amqp`, `filesystem`...)."""
    url = str(app.conf.broker_url or "")
    scheme = url.partition("://")[0].partition("+")[0].lower()
    return scheme or "amqp"


def on_message(connection: Any, priority: int) -> int:
    """The value of the message's `priority` property on this kombu connection's broker: the
    connection the message goes out on says which, whatever the settings said at start."""
    driver = getattr(getattr(connection, "transport", None), "driver_type", "")
    return HIGHEST - priority if driver == "redis" else priority


# --- what the host's Celery settings must say -----------------------------------------------------
def config_problems(app: Any) -> list[str]:
    """Why this app's broker settings cannot order step messages by priority (empty: they
    can). Checked by `manage.py check` once a workflow declares a priority."""
    conf = app.conf
    name = transport(app)
    if name in ORDERED_TRANSPORTS:
        declared_max = conf.task_queue_max_priority
        if declared_max is None:
            return [
                "RabbitMQ orders messages by priority only in a queue declared with "
                "x-max-priority: set CELERY_TASK_QUEUE_MAX_PRIORITY = 9 (a queue declared "
                "before keeps its arguments: delete it, or use a new vhost)"
            ]
        if int(declared_max) < HIGHEST:
            return [
                f"CELERY_TASK_QUEUE_MAX_PRIORITY is {declared_max}: priorities above it count "
                f"as {declared_max}; set it to {HIGHEST}"
            ]
        return []
    if name in REVERSED_TRANSPORTS:
        options = conf.broker_transport_options or {}
        steps = options.get("priority_steps")
        if steps is None or len(set(steps)) < HIGHEST - LOWEST + 1:
            return [
                "kombu's Redis transport keeps one list per priority step "
                f"({'its default [0, 3, 6, 9]' if steps is None else steps}): priorities in "
                "one step are taken in arrival order; set "
                'CELERY_BROKER_TRANSPORT_OPTIONS["priority_steps"] = list(range(10))'
            ]
        return []
    # The filesystem and memory transports (a development default, one machine) have no
    # priorities: steps go in arrival order, as docs/operating.md says; nothing to configure.
    return []
