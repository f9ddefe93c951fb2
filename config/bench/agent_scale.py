"""`bench`'s "agent_scale": agent runs of 10, 100 and 400 positions on a worker, what each run
stores and what its last task's replay costs; and the worker's memory after each.

The agent is scripted: a step in code, then model turns that each ask for one read-only tool
call, then an answer. Its last task replays every call before it from the checkpoints, which
is where a run's length shows: the stored conversation, the rows loaded, the fingerprints.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from django.db import connection
from django.test import override_settings

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow.agent import (
    ModelRequest,
    ScriptedModel,
    Toolbox,
    ToolContext,
    answer,
    call,
    calls,
    system_message,
    tool_result_message,
    user_message,
)
from agentflow.agent import loop as agent_loop
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from agentflow.testing.processes import ProcessStartError, WorkerProcess, current_database_url
from config.bench.throughput import BenchError, wait_until
from config.bench.workload import broker_url

AGENT = "bench_agent"
POSITIONS = (10, 100, 400)
#: The replays timed per run, in this process; the fastest is reported, as `timeit` does: on a
#: shared machine it is the one least slowed by other processes.
REPLAYS = 9
#: Generous caps for the bench's long runs (the defaults stop a run at 20 turns).
LIMITS = {
    "AGENTFLOW_AGENT_MAX_TURNS": 10_000,
    "AGENTFLOW_AGENT_MAX_TOOL_CALLS": 10_000,
    "AGENTFLOW_AGENT_MAX_TOKENS": 10**12,
}

toolbox = Toolbox(AGENT)


@toolbox.tool("lookup", read_only=True, description="A number and its square.")
def lookup(ctx: ToolContext, n: int) -> dict[str, Any]:
    return {"n": n, "square": n * n}


def plan(request: ModelRequest) -> Any:
    """Turn k sits at position 2k (after the step at 1): the last turn, at the run's last
    position, answers."""
    positions = int(str(request.messages[1]["content"]).removeprefix("positions="))
    if 2 * request.turn < positions:
        return calls(call("lookup", n=request.turn))
    return answer(f"Looked up {request.turn - 1} numbers.")


agent = durable.CodeWorkflow(
    AGENT, version=1, toolbox=toolbox, model=ScriptedModel("scripted-bench", plan)
)


@agent.run
def look_up(ctx: durable.AgentContext) -> str:
    positions = ctx.step("start", lambda step: ctx.input["positions"])
    messages = [system_message("You look numbers up."), user_message(f"positions={positions}")]
    while not (turn := ctx.llm(messages)).is_final:
        messages.append(turn.message)
        for tool_call in turn.tool_calls:
            messages.append(tool_result_message(tool_call.id, ctx.tool(tool_call).result))
    return turn.text


@dataclass(frozen=True, kw_only=True)
class AgentScale:
    positions: int
    #: What the run's checkpoints and events take in Postgres (`pg_column_size` of each row).
    bytes: int
    bytes_per_position: float
    #: The last task's engine time: load the run's checkpoints and replay every call before
    #: its own (what each task does before its step), the fastest of REPLAYS, in this process.
    ms_per_task_last: float
    #: From start to COMPLETED on the worker.
    run_s: float
    #: The worker's pool process, resident, after the run (the runs share one process).
    worker_rss_mb: float


@dataclass(frozen=True, kw_only=True)
class AgentMemory:
    """The worker's pool process, resident: once started, after each run, and after the
    longest run made again (a process that kept what its tasks loaded would grow there)."""

    started_mb: float
    after_runs_mb: list[float]
    after_longest_again_mb: float


def agent_scale(
    positions: Sequence[int] = POSITIONS, *, progress: Callable[[str], None] = lambda _: None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One run of each length, in order, then the longest again, on one fresh single-process
    worker: the figures of each run, and the worker's memory."""
    for length in positions:
        if length < 4 or length % 2:
            raise BenchError(f"agent runs have an even number of positions, 4 or more: {length}")
    store.runs_delete(workflows=[AGENT])
    worker = WorkerProcess(
        concurrency=1,
        name=f"bench-agent-{uuid.uuid4().hex[:6]}",
        env={
            "DATABASE_URL": current_database_url(),
            "CELERY_BROKER_URL": broker_url(),
            "AGENTFLOW_FAULTS": "0",
            "AGENTFLOW_CRASH_AT": "",
            **{name: str(value) for name, value in LIMITS.items()},
        },
    )
    figures = []
    try:
        worker.start(timeout=60)
        started = _worker_rss_mb(worker)
        for length in positions:
            progress(f"agent scale: one run of {length} positions")
            figures.append(_one_run(worker, length))
        longest = max(positions)
        progress(f"agent scale: the run of {longest} positions again, for the worker's memory")
        again = _one_run(worker, longest)
    except (BenchError, ProcessStartError) as exc:
        raise BenchError(f"{exc}\nworker log ({worker.log_path}):\n{worker.log_tail()}") from None
    finally:
        worker.kill()
        store.runs_delete(workflows=[AGENT])
    worker.log_path.unlink(missing_ok=True)
    memory = AgentMemory(
        started_mb=started,
        after_runs_mb=[figure.worker_rss_mb for figure in figures],
        after_longest_again_mb=again.worker_rss_mb,
    )
    return [asdict(figure) for figure in figures], asdict(memory)


def _one_run(worker: WorkerProcess, positions: int) -> AgentScale:
    started = time.perf_counter()
    run_id = durable.start(AGENT, input={"positions": positions})
    status, error = wait_until(
        lambda: _finished(run_id),
        timeout=60 + positions,
        what=lambda: f"agent run {run_id} of {positions} positions to finish",
    )
    run_s = time.perf_counter() - started
    if status != RunStatus.COMPLETED:
        raise BenchError(f"agent run {run_id} ended {status}: {error}")
    recorded = StepCheckpoint.objects.filter(run_id=run_id).count()
    if recorded != positions:
        raise BenchError(f"agent run {run_id} made {recorded} calls, not {positions}")
    stored = _stored_bytes(run_id)
    return AgentScale(
        positions=positions,
        bytes=stored,
        bytes_per_position=round(stored / positions, 1),
        ms_per_task_last=round(_last_task_ms(run_id, positions), 3),
        run_s=round(run_s, 3),
        worker_rss_mb=_worker_rss_mb(worker),
    )


def _finished(run_id: str) -> tuple[str, str] | None:
    found = WorkflowRun.objects.filter(pk=run_id).values_list("status", "error").first()
    return found if found is not None and found[0] not in ACTIVE_RUN_STATUSES else None


def _stored_bytes(run_id: str) -> int:
    tables = (StepCheckpoint._meta.db_table, RunEvent._meta.db_table)
    total = 0
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(
                f"SELECT COALESCE(SUM(pg_column_size(t.*)), 0) FROM {table} t WHERE t.run_id = %s",
                [run_id],
            )
            total += int(cursor.fetchone()[0])
    return total


def _last_task_ms(run_id: str, positions: int) -> float:
    """What the task at the run's last position does before its step: load the checkpoints
    and replay the function up to its call there (recorded now, so it is checked, not made)."""
    samples = []
    with override_settings(**LIMITS):
        for _ in range(REPLAYS):
            began = time.perf_counter()
            outcome = agent_loop.replay(
                agent,
                run_id=run_id,
                input={"positions": positions},
                seq=positions,
                branch=0,
                recorded=store.replay_load(run_id, positions + 1),
                reusable=list,
                calls=lambda: store.calls_load(run_id, positions + 1),
            )
            samples.append((time.perf_counter() - began) * 1000)
            if not isinstance(outcome, agent_loop.NextCall) or outcome.replayed != positions - 1:
                raise BenchError(f"the replay of {run_id} at {positions} ended {outcome}")
    return min(samples)


def _worker_rss_mb(worker: WorkerProcess) -> float:
    [pid] = worker.children()
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise BenchError(f"no resident size for the worker's process {pid}")
