"""`@task` functions the tasks-backend tests enqueue, in the test process and in workers (which
import this module when handed a run of one: agentflow._tasks_backend.resolver).

Each records its execution and makes its effect at the partner stand-in (tests.support.partner)
under the task's idempotency key, so a test counts executions and effects, never guesses.
"""

from __future__ import annotations

from typing import Any

import django

from agentflow import durable
from tests.support import partner

try:  # Django 6
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

#: Durable options through `@task(**kwargs)`: Django 6.1 and the 5.2 backport pass them to the
#: backend; Django 6.0's decorator refuses a keyword it does not know (TypeError).
OPTIONS = django.VERSION[:2] != (6, 0)


@task(takes_context=True)
def charge(context: Any, order: str, *, hold: bool = False) -> dict[str, Any]:
    """An effect: made once per key at the partner, however often the task runs."""
    run_id = context.task_result.id
    partner.record_execution(run_id, 1, "charge", context.attempt)
    if hold:
        partner.wait_for_release(run_id)  # the test watches it RUNNING, then lets it go
    answer = partner.apply(context.idempotency_key)
    return {"order": order, "key": answer["key"]}


if OPTIONS:

    @task(kind="read", retry=durable.RetryPolicy(max_attempts=1))
    def explode(message: str) -> None:
        raise ValueError(message)


@task
def plain(numbers: list[int]) -> int:
    return sum(numbers)


@task
async def later(text: str) -> str:
    return text.upper()


if OPTIONS:

    @task(replay=True, takes_context=True)
    def onboard(context: Any, user: str) -> dict[str, Any]:
        """Durable calls inside a task: an effect step, a signal it waits for, then another."""
        welcomed = context.step(
            "welcome", lambda ctx: partner.apply(ctx.idempotency_key), kind="effect"
        )
        confirmed = context.wait_for("confirmed", timeout=600)
        return {"user": user, "welcome": welcomed["key"], "confirmed": confirmed.payload}
