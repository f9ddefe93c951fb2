"""What an operator sees, from real processes: gunicorn, Celery workers, celery beat, Postgres,
Redis and the partner sandbox (issue 11: metrics, structured logs, traces, the watched sweeper).

/metrics is read with prometheus_client's own parser; log lines are parsed as JSON; spans arrive
over OTLP/HTTP from every process at a collector this test runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus
from agentflow.models import RunEvent, WorkflowRun
from agentflow.testing.processes import RedisServer, WorkerProcess
from agentflow.testing.waiting import wait_for
from refunds.models import RefundRequest
from refunds.workflows import refund as refund_workflow
from tests.support import partner, workflows
from tests.support.processes import EnvBuilder, Workers, log_has
from tests.support.sandbox import SandboxProcess
from tests.support.stack import BeatProcess, SpanCollector, WebProcess

pytestmark = pytest.mark.django_db(transaction=True)

REFUND_STEPS = [name for name, step in refund_workflow.steps.items() if not step.compensation_only]
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


# --- the stack --------------------------------------------------------------------------------
@pytest.fixture
def stack_env(
    worker_env: EnvBuilder, clean_sandbox: SandboxProcess, tmp_path: Path
) -> Callable[..., dict[str, str]]:
    """Environment shared by web, worker and beat: one database, one broker, one metrics dir."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()

    def build(**overrides: str) -> dict[str, str]:
        return worker_env(
            PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
            SANDBOX_URL=clean_sandbox.url,
            SANDBOX_SMTP_PORT=str(clean_sandbox.smtp_port),
            STRIPE_API_BASE=clean_sandbox.url,
            EMAIL_HOST="127.0.0.1",
            EMAIL_PORT=str(clean_sandbox.smtp_port),
            REFUNDS_SUBMIT_LIMIT="0",
            REFUNDS_PARTNER_RETRY_BASE_SECONDS="0.25",
            AGENTFLOW_LOG_FORMAT="json",
            AGENTFLOW_LEASE_SECONDS="2",
            AGENTFLOW_SWEEP_INTERVAL="1",
            **{"AGENTFLOW_METRICS_PUBLIC": "1", **overrides},  # scraped as on a private network
        )

    return build


class Stack:
    def __init__(self, build_env: Callable[..., dict[str, str]], workers: Workers, logs: Path):
        self.build_env = build_env
        self.workers = workers
        self.logs = logs
        self.started: list[WebProcess | BeatProcess] = []

    def web(self, **env: str) -> WebProcess:
        web = WebProcess(self.build_env(**env), self.logs / f"web{len(self.started)}.log")
        self.started.append(web)
        web.start()
        return web

    def beat(self, **env: str) -> BeatProcess:
        beat = BeatProcess(self.build_env(**env), self.logs / f"beat{len(self.started)}.log")
        self.started.append(beat)
        beat.start()
        return beat

    def worker(self, **env: str) -> WorkerProcess:
        return self.workers.start(concurrency=2, env=self.build_env(**env))

    def stop(self) -> None:
        self.workers.kill_all()
        for process in self.started:
            process.stop()


@pytest.fixture
def stack(
    stack_env: Callable[..., dict[str, str]], workers: Workers, tmp_path: Path
) -> Iterator[Stack]:
    started = Stack(stack_env, workers, tmp_path / "logs")
    try:
        yield started
    finally:
        started.stop()  # before the test database is flushed


# --- helpers ------------------------------------------------------------------------------------
def scrape(web: WebProcess) -> tuple[Samples, dict[str, str]]:
    """Every sample of /metrics by (name, labels), and each family's type, via the library's
    own parser (which raises on anything malformed)."""
    status, body = web.get("/metrics")
    assert status == 200, body[:500]
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(body.decode()):
        types[family.name] = family.type
        for sample in family.samples:
            samples[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return samples, types


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def refund_run(public_id: str) -> WorkflowRun:
    def found() -> WorkflowRun | None:
        refund = RefundRequest.objects.filter(public_id=public_id).first()
        return WorkflowRun.objects.filter(pk=refund.workflow_id).first() if refund else None

    return wait_for(found, timeout=30, what=f"the run of {public_id}")


def wait_finished(run_id: str, timeout: float = 90) -> WorkflowRun:
    def done() -> WorkflowRun | None:
        run = WorkflowRun.objects.get(pk=run_id)
        return run if run.status not in ACTIVE_RUN_STATUSES else None

    return wait_for(done, timeout=timeout, interval=0.1, what=f"run {run_id} to finish")


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The log's JSON lines (Celery's start-up banner is printed, not logged, so it is not)."""
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def names(spans: list[Any]) -> set[str]:
    return {span.name for span in spans}


def pool_pids(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


# --- metrics -----------------------------------------------------------------------------------
def test_metrics__a_refund_moves_counters_in_web_and_worker_processes(
    stack: Stack, stack_env: Callable[..., dict[str, str]], clean_sandbox: SandboxProcess
) -> None:
    clean_sandbox.set_fault(endpoint="crm.update", error_rate=1.0, error_status=503, count=1)
    web = stack.web()
    worker = stack.worker()
    before, _ = scrape(web)

    public_id = web.submit_refund("MET001")
    run = wait_finished(refund_run(public_id).id)
    assert run.status == RunStatus.COMPLETED, run.error

    after, types = scrape(web)
    assert value(after, "agentflow_runs_started_total", workflow="refund") == (
        value(before, "agentflow_runs_started_total", workflow="refund") + 1
    )  # counted by the gunicorn worker that served the POST
    assert value(after, "agentflow_runs_finished_total", workflow="refund", status="COMPLETED") == (
        value(before, "agentflow_runs_finished_total", workflow="refund", status="COMPLETED") + 1
    )
    assert types["agentflow_step_duration_seconds"] == "histogram"
    for step in REFUND_STEPS:  # observed by the Celery pool children that ran the steps
        kind = str(refund_workflow.steps[step].kind)
        labels = {"workflow": "refund", "step": step, "kind": kind}
        attempts = 2 if step == "update_crm" else 1  # the CRM failed once
        assert value(after, "agentflow_step_duration_seconds_count", **labels) == attempts, step
        assert value(after, "agentflow_step_duration_seconds_bucket", le="+Inf", **labels) == (
            attempts
        )
    for name, labels in (
        ("agentflow_run_events_total", {"kind": "attempt_failed"}),  # the retry
        ("agentflow_partner_errors_total", {"partner": "crm", "kind": "retryable"}),
    ):
        assert value(after, name, **labels) == value(before, name, **labels) + 1, name
    assert value(after, "agentflow_runs_active", workflow="refund", status="RUNNING") == 0
    assert value(after, "agentflow_sweeper_seconds_since_last_sweep") == float("inf")

    # Which processes wrote them: each writes its own file, named by its pid.
    files = {p.name for p in Path(stack_env()["PROMETHEUS_MULTIPROC_DIR"]).iterdir()}
    web_pids = pool_pids(web.proc.pid)  # type: ignore[union-attr]
    assert any(f"-{pid}-" in name for name in files for pid in web_pids), (files, web_pids)
    assert any(
        name.startswith("histogram_") and f"-{pid}-" in name
        for name in files
        for pid in worker.children()
    ), files


def test_metrics__a_pool_child_killed_mid_step_loses_no_series(stack: Stack) -> None:
    web = stack.web()
    worker = stack.worker()
    children = worker.children()
    # Warm both pool processes up until each has written step timings of its own: runs side
    # by side, so neither process can take every step alone.
    for _ in range(20):
        for run_id in [durable.start(workflows.chain.name) for _ in range(4)]:
            wait_finished(run_id, timeout=30)
        if all(_has_histogram_file(stack, pid) for pid in children):
            break
    assert all(_has_histogram_file(stack, pid) for pid in children), children

    run_id = durable.start(workflows.held.name)
    victim = wait_for(
        lambda: next((e["pid"] for e in partner.executions(run_id) if e["step"] == "hold"), None),
        what="the held step to start",
    )
    before, types = scrape(web)
    worker.kill_child(victim)
    partner.release(run_id)
    assert wait_finished(run_id).status == RunStatus.COMPLETED

    after, _ = scrape(web)
    counted = {name for name, kind in types.items() if kind in ("counter", "histogram")}
    missing, lower = [], []
    for key, seen in before.items():
        family = key[0].removesuffix("_total").removesuffix("_bucket")
        family = family.removesuffix("_count").removesuffix("_sum").removesuffix("_created")
        if key not in after:
            missing.append(key)
        elif family in counted and after[key] < seen:
            lower.append((key, seen, after[key]))
    assert missing == [] and lower == []
    # The replacement child folded the dead one's file into the archive: still added in.
    assert not _has_histogram_file(stack, victim)
    assert (_metrics_dir(stack) / "archive.json").exists()
    takeovers = ("agentflow_run_events_total", (("kind", "takeover"),))
    assert after[takeovers] == before.get(takeovers, 0) + 1  # the redelivery took the step over
    steps = (
        "agentflow_step_duration_seconds_count",
        (("kind", "read"), ("step", "finish"), ("workflow", workflows.held.name)),
    )
    assert after[steps] == before.get(steps, 0) + 1


def _metrics_dir(stack: Stack) -> Path:
    return Path(stack.build_env()["PROMETHEUS_MULTIPROC_DIR"])


def _has_histogram_file(stack: Stack, pid: int) -> bool:
    """Files are named host-pidns-pid-start (see agentflow._observe.metric_files)."""
    return any(_metrics_dir(stack).glob(f"histogram_*-{pid}-*.db"))


def test_metrics__bearer_token_is_required_when_set(stack: Stack) -> None:
    web = stack.web(AGENTFLOW_METRICS_TOKEN="s3cret-token")

    assert web.get("/metrics")[0] == 401
    assert web.get("/metrics", {"Authorization": "Bearer wrong"})[0] == 401
    status, body = web.get("/metrics", {"Authorization": "Bearer s3cret-token"})
    assert status == 200
    assert "agentflow_runs_active" in {
        f.name for f in text_string_to_metric_families(body.decode())
    }


def test_metrics__closed_with_debug_off_and_neither_a_token_nor_public(stack: Stack) -> None:
    web = stack.web(AGENTFLOW_METRICS_PUBLIC="0")

    assert web.get("/metrics")[0] == 404


# --- logs -------------------------------------------------------------------------------------
def test_logs__json_lines_of_web_worker_and_beat_carry_the_refunds_run_id(
    stack: Stack, broker: RedisServer, clean_sandbox: SandboxProcess
) -> None:
    clean_sandbox.set_fault(endpoint="crm.update", error_rate=1.0, error_status=503, count=1)
    web = stack.web()
    beat = stack.beat()
    public_id = web.submit_refund("LOG001")
    run_id = refund_run(public_id).id
    # The broker lost the step (from every priority list of the queue: a form refund's message
    # waits in `celery:<step>`): only the sweeper brings it back.
    broker.client().delete(*broker.client().keys("celery*"))
    worker = stack.worker()
    assert wait_finished(run_id).status == RunStatus.COMPLETED

    web_lines = [line for line in json_lines(web.log_path) if line.get("run_id") == run_id]
    assert web_lines and all(line["process"] == "web" for line in web_lines)
    assert any(line["event"] == f"run {run_id} of refund started" for line in web_lines)

    def run_lines() -> list[dict[str, Any]] | None:  # the last line follows the last commit
        lines = [line for line in json_lines(worker.log_path) if line.get("run_id") == run_id]
        return lines if any(line["event"] == f"run {run_id} completed" for line in lines) else None

    worker_lines = wait_for(run_lines, what="the run's last line")
    assert {line["process"] for line in worker_lines} == {"worker"}
    # Every line a step caused names the step, its attempt, its key and the process owning it.
    stepped = [line for line in worker_lines if line["logger"] != "agentflow.sweeper"]
    assert stepped
    pool = {str(pid) for pid in worker.children()}
    for line in stepped:
        assert line["workflow"] == "refund" and line["step"] in refund_workflow.steps, line
        assert line["idempotency_key"] == f"{run_id}_step_{line['seq']}"
        assert isinstance(line["attempt"], int) and line["owner"].split("/")[1] in pool
    # An attempt that went to plan is a DEBUG line; the failed CRM attempt is news.
    [retry] = [line for line in stepped if line["logger"] == "agentflow.steps"]
    assert (retry["step"], retry["attempt"], retry["level"]) == ("update_crm", 1, "info")
    assert retry["events"] == ["attempt_failed"]

    # Beat's sweeper brought the lost step back, in beat's own process, and said which run.
    beat_lines = json_lines(beat.log_path)
    assert {line["process"] for line in beat_lines} == {"beat"}, beat_lines
    sweeps = [
        line
        for line in beat_lines
        if line["logger"] == "agentflow.sweeper" and run_id in line.get("run_ids", [])
    ]
    assert sweeps and run_id in sweeps[0]["event"]
    assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SWEEP_REQUEUE).exists()
    assert [line["logger"] for line in beat_lines].count("agentflow.beat") == 1, beat_lines


def test_logs__every_attempt_is_a_debug_line_when_asked_for(stack: Stack) -> None:
    web = stack.web()
    worker = stack.worker(LOG_LEVEL="DEBUG")
    run_id = refund_run(web.submit_refund("LOG002")).id
    assert wait_finished(run_id).status == RunStatus.COMPLETED

    def step_lines() -> list[dict[str, Any]] | None:
        lines = [
            line
            for line in json_lines(worker.log_path)
            if line.get("run_id") == run_id and line["logger"] == "agentflow.steps"
        ]
        return lines if len(lines) == len(REFUND_STEPS) else None

    lines = wait_for(step_lines, what="a line per step")
    assert [line["step"] for line in lines] == REFUND_STEPS
    assert {line["level"] for line in lines} == {"debug"}
    assert all(line["duration_ms"] > 0 for line in lines)


# --- traces -----------------------------------------------------------------------------------
def test_tracing__one_refund_is_one_trace_from_the_post_through_every_step(
    stack: Stack, clean_sandbox: SandboxProcess
) -> None:
    # The CRM fails once: its step runs twice, each attempt a span, the retry under the first.
    clean_sandbox.set_fault(endpoint="crm.update", error_rate=1.0, error_status=503, count=1)
    with SpanCollector() as collector:
        traced = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        web = stack.web(**traced)
        stack.worker(**traced)
        public_id = web.submit_refund("TRC001")
        run_id = refund_run(public_id).id
        assert wait_finished(run_id).status == RunStatus.COMPLETED

        def whole_trace() -> list[Any] | None:
            spans = collector.spans()
            steps = {s.name for s in spans if s.attributes.get("agentflow.run_id") == run_id}
            done = {f"step {name}" for name in REFUND_STEPS} <= steps
            calls = sum(s.name == "crm POST updates" for s in spans)
            return spans if done and calls == 2 and "stripe authorize" in names(spans) else None

        try:
            spans = wait_for(whole_trace, timeout=30, what="every span to be exported")
        except AssertionError:
            print([(s.name, s.attributes) for s in collector.spans()])
            raise

    [post] = [s for s in spans if s.name == "POST /refunds/new/"]
    assert post.attributes["agentflow.run_id"] == run_id
    assert post.service["process.kind"] == "web"
    trace = [s for s in spans if s.trace_id == post.trace_id]
    by_id = {s.span_id: s for s in trace}
    steps = [s for s in trace if s.name.startswith("step ")]
    assert sorted(s.name for s in steps) == sorted(
        [f"step {name}" for name in REFUND_STEPS] + ["step update_crm"]
    )
    for span in steps:
        assert span.service["process.kind"] == "worker"
        assert span.attributes["agentflow.run_id"] == run_id
        assert span.attributes["agentflow.idempotency_key"] == (
            f"{run_id}_step_{span.attributes['agentflow.seq']}"
        )
        assert span.parent_span_id in by_id  # parent-linked, all in the one trace
    [charge] = [s for s in trace if s.name == "stripe authorize"]
    assert by_id[charge.parent_span_id].name == "step charge_customer"
    assert (
        charge.attributes["agentflow.idempotency_key"]
        == (by_id[charge.parent_span_id].attributes["agentflow.idempotency_key"])
    )
    # The chain: the POST published step 1, each step published the next.
    first = next(s for s in steps if s.attributes["agentflow.seq"] == 1)
    assert first.parent_span_id == post.span_id
    for span in steps:
        if span.attributes["agentflow.seq"] > 1 and span.attributes["agentflow.attempt"] == 1:
            assert by_id[span.parent_span_id].attributes["agentflow.seq"] == (
                span.attributes["agentflow.seq"] - 1
            )
    # The retry: attempt 2 was published by attempt 1, whose CRM call failed.
    crm = {s.attributes["agentflow.attempt"]: s for s in steps if s.name == "step update_crm"}
    assert crm[2].parent_span_id == crm[1].span_id
    calls = {
        by_id[s.parent_span_id].attributes["agentflow.attempt"]: s
        for s in trace
        if s.name == "crm POST updates"
    }
    assert (calls[1].status_code, calls[2].status_code) == (2, 0)  # error, then fine


def test_tracing__a_step_the_sweeper_republishes_stays_in_the_runs_trace(
    stack: Stack, broker: RedisServer
) -> None:
    with SpanCollector() as collector:
        traced = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        web = stack.web(**traced)
        public_id = web.submit_refund("TRC002")
        run_id = refund_run(public_id).id
        # Lost, in every priority list: the sweeper's message carries no context.
        broker.client().delete(*broker.client().keys("celery*"))
        stack.worker(**traced)
        stack.beat(**traced)
        assert wait_finished(run_id).status == RunStatus.COMPLETED
        assert RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SWEEP_REQUEUE).exists()

        def first_step() -> Any:
            return next((s for s in collector.spans() if s.name == "step load_request"), None)

        span = wait_for(first_step, timeout=30, what="the first step's span")
        post = next(s for s in collector.spans() if s.name == "POST /refunds/new/")
    assert span.trace_id == post.trace_id
    assert span.parent_span_id == post.span_id
    assert WorkflowRun.objects.get(pk=run_id).trace_parent.split("-")[1] == post.trace_id


# --- the watched sweeper ----------------------------------------------------------------------
def test_healthz__turns_503_naming_the_sweeper_when_beat_stops_and_200_after_it_restarts(
    stack: Stack,
) -> None:
    web = stack.web()
    stack.worker()
    beat = stack.beat()

    def health(code: int) -> dict[str, Any] | None:
        status, body = web.get("/healthz")
        return json.loads(body) if status == code else None

    wait_for(lambda: health(200), timeout=60, what="the first sweep")
    samples, _ = scrape(web)
    assert math.isfinite(value(samples, "agentflow_sweeper_seconds_since_last_sweep"))
    beat.stop()

    stale = wait_for(lambda: health(503), timeout=30, what="/healthz to notice")
    assert stale["sweeper"].startswith("error: no sweep for")
    assert stale["sweeper_age_seconds"] > 3  # 3 intervals of 1 s
    assert {stale["database"], stale["broker"]} == {"ok"}
    samples, _ = scrape(web)
    assert value(samples, "agentflow_sweeper_seconds_since_last_sweep") > 3

    beat.start()
    back = wait_for(lambda: health(200), timeout=60, what="/healthz to recover")
    assert back["sweeper"] == "ok" and back["sweeper_age_seconds"] <= 3


def test_quiet__idle_sweeps_log_nothing_and_a_republish_names_its_run(
    workers: Workers, worker_env: EnvBuilder
) -> None:
    worker = workers.start(
        beat=True,
        env=worker_env(AGENTFLOW_LOG_FORMAT="text", AGENTFLOW_SWEEP_INTERVAL="1"),
    )
    wait_for(lambda: log_has(worker, "beat started"), what="the embedded beat")
    ready_at = len(worker.log_path.read_text(errors="replace"))
    seen: set[float] = set()

    def three_sweeps() -> bool:
        beat = store.heartbeat_read()
        if beat is not None:
            seen.add(round(timezone.now().timestamp() - beat.age_seconds, 1))
        return len(seen) >= 4

    wait_for(three_sweeps, timeout=60, interval=0.2, what="three idle sweeps")
    idle = worker.log_path.read_text(errors="replace")[ready_at:]
    chatter = [line for line in idle.splitlines() if "sweep" in line.lower() or "due task" in line]
    assert chatter == [], idle

    run = WorkflowRun.objects.create(
        workflow=workflows.chain.name,
        version=1,
        status=RunStatus.RUNNING,
        current_step="prepare",
        current_seq=1,
        wake_at=timezone.now() - timedelta(minutes=1),
    )  # its message was lost
    wait_finished(run.id, timeout=30)
    log = worker.log_path.read_text(errors="replace")
    [line] = [line for line in log.splitlines() if "sweep re-published" in line]
    assert f"sweep re-published 1 run(s): {run.id}" in line and "info" in line.lower()
    assert "Task agentflow.run_step" not in log  # Celery's per-task received/succeeded lines
    [beat_line] = [line for line in log.splitlines() if "beat started" in line]
    assert "process=beat" in beat_line  # the embedded beat is a process of its own
