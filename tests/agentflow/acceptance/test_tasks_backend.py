"""Django's `@task` on agentflow with real Celery workers (docs/tasks-backend.md): SIGKILL mid-task,
a process that dies right after its enqueue commits, and results read from this process while
a worker runs the task.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import transaction

from agentflow._tasks_backend import framework
from agentflow.models import WorkflowRun
from agentflow.testing.waiting import wait_for
from tests.support import durable_tasks, partner
from tests.support.processes import EnvBuilder, Workers, log_has

pytestmark = pytest.mark.django_db(transaction=True)

STATUS = framework.TaskResultStatus
#: Waits long enough for a loaded machine: a takeover waits out a lease (AGENTFLOW_LEASE_SECONDS
#: 10 in the workers) when the dead owner's lock is not seen free at once.
FINISH_SECONDS = 120.0


def result_when(result_id: str, *statuses: str) -> Any:
    """The task's result read here, once its status is one of `statuses`."""

    def found() -> Any:
        result = durable_tasks.charge.get_result(result_id)
        return result if result.status in statuses else None

    return wait_for(found, timeout=FINISH_SECONDS, interval=0.05, what=f"{result_id} {statuses}")


def test_sigkill_mid_task__runs_once__effect_once_with_the_same_key(workers: Workers) -> None:
    worker = workers.start(AGENTFLOW_FAULTS="1", AGENTFLOW_CRASH_AT="task:after_effect")
    with transaction.atomic():
        result_id = durable_tasks.charge.enqueue("o-kill").id

    result = result_when(result_id, STATUS.SUCCESSFUL, STATUS.FAILED)

    assert log_has(worker, "fault injection: SIGKILL at task:after_effect")
    assert result.status == STATUS.SUCCESSFUL, result.errors
    key = result.return_value["key"]
    assert partner.effects() == {key: 1}  # made once
    assert partner.requests()[key] == 2  # asked twice, under the same key
    assert [e["attempt"] for e in partner.executions(result_id)] == [1, 2]
    assert result.attempts == 2 and len(result.worker_ids) == 2


def test_get_result__running_then_successful__read_from_another_process(
    workers: Workers,
) -> None:
    workers.start()
    result_id = durable_tasks.charge.enqueue("o-watch", hold=True).id

    running = result_when(result_id, STATUS.RUNNING)
    assert running.started_at is not None and running.last_attempted_at is not None
    assert running.finished_at is None and len(running.worker_ids) == 1
    with pytest.raises(ValueError, match="not finished"):
        running.return_value  # noqa: B018 - Django's property raises until it succeeded
    partner.release(result_id)

    done = result_when(result_id, STATUS.SUCCESSFUL)
    assert done.return_value["order"] == "o-watch"
    assert done.finished_at >= done.started_at == running.started_at
    assert partner.effects() == {done.return_value["key"]: 1}


def test_enqueue_committed_then_the_process_dies__the_sweeper_runs_it(
    workers: Workers, worker_env: EnvBuilder
) -> None:
    """The enqueuing process is SIGKILLed by its first commit hook, before the run's message
    is published: only the committed row is left, and the sweeper's republish runs it."""
    script = textwrap.dedent(
        """
        import os, signal
        from django.db import transaction
        from tests.support import durable_tasks
        with transaction.atomic():
            transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
            print(durable_tasks.charge.enqueue("o-orphan").id, flush=True)
        """
    )
    enqueued = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        env={**os.environ, **worker_env()},
        cwd=django_settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert enqueued.returncode == -9, enqueued.stderr
    result_id = enqueued.stdout.strip().splitlines()[-1]
    assert WorkflowRun.objects.filter(pk=result_id).exists()  # committed, never published

    workers.start(beat=True, AGENTFLOW_SWEEP_INTERVAL="1")
    result = result_when(result_id, STATUS.SUCCESSFUL)
    assert partner.effects() == {result.return_value["key"]: 1}


def test_get_result__unknown_id__does_not_exist() -> None:
    with pytest.raises(framework.TaskResultDoesNotExist):
        durable_tasks.charge.get_result("run_that_never_was")
