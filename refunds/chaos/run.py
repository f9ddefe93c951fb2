"""One chaos run (docs/figures/chaos.md): start its own broker, sandbox, beat and workers (and, to
crash the database, its own PostgreSQL), send refunds through the form, kill things at random
moments, wait for every run to finish, and report.

Everything it starts it also stops, on success, error or Ctrl-C. The rows it created stay as
evidence unless `cleanup` is set (on a private PostgreSQL they go with the server; its log
stays with the others).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import dj_database_url
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connections
from django.test.utils import override_settings
from django.utils import timezone

from agentflow import durable, logs
from agentflow._base.states import ACTIVE_RUN_STATUSES, TERMINAL_RUN_STATUSES
from agentflow.models import WorkflowRun
from agentflow.testing.processes import (
    PgBouncerServer,
    PostgresServer,
    current_database_url,
    publishing_to,
)
from refunds.chaos import evidence as evidence_mod
from refunds.chaos import outage as outage_mod
from refunds.chaos import partner_limits, report, traffic
from refunds.chaos.kills import Monkey, WorkerPool
from refunds.chaos.outage import DatabaseOutage
from refunds.chaos.processes import (
    Beat,
    RabbitBroker,
    RedisBroker,
    Sandbox,
    Web,
    airline_today,
)
from refunds.models import RefundRequest
from refunds.services import RESUBMIT_WINDOW

#: Modest partner trouble on every endpoint; `drop_rate` applies the effect and then hangs up,
#: the "charged, but the answer never came back" case. Retries must converge through all of it.
FAULTS: list[dict[str, Any]] = [
    {"endpoint": "payment_intents.create", "latency_ms": 150, "error_rate": 0.1, "drop_rate": 0.15},
    {"endpoint": "payment_intents.search", "latency_ms": 50, "error_rate": 0.1},
    {"endpoint": "refunds.create", "latency_ms": 50, "error_rate": 0.1},
    {"endpoint": "airline.booking", "latency_ms": 50, "error_rate": 0.1, "error_status": 503},
    {"endpoint": "airline.cancel_seat", "latency_ms": 200, "error_rate": 0.05, "drop_rate": 0.1},
    {"endpoint": "airline.boarding_pass", "latency_ms": 150, "error_rate": 0.05, "drop_rate": 0.1},
    {
        "endpoint": "crm.update",
        "latency_ms": 100,
        "error_rate": 0.1,
        "error_status": 429,
        "drop_rate": 0.1,
    },
    {"endpoint": "smtp", "latency_ms": 50, "error_rate": 0.05, "drop_rate": 0.05},
]
POLL_SECONDS = 0.25
PROGRESS_SECONDS = 5.0


class ChaosError(Exception):
    """The chaos run cannot run here."""


@dataclass(frozen=True, kw_only=True)
class ChaosConfig:
    refunds: int = 100
    seed: int | None = None
    timeout_seconds: float = 600.0
    workers: int = 2
    concurrency: int = 2
    #: Default: one per 15 refunds, at least one.
    child_kills: int | None = None
    worker_kills: int = 1
    broker_restart: bool = True
    kill_interval_seconds: float = 3.0
    submit_per_second: float = 10.0
    #: Default: one in ten refunds, at least one.
    double_submits: int | None = None
    #: Below the defaults (lease 10 s, sweep every 5 s) so a whole-worker kill heals in seconds.
    lease_seconds: int = 5
    sweep_interval_seconds: int = 2
    faults: bool = True
    cleanup: bool = False
    #: Crashes of the database server mid-run. When above 0 the whole run (this process, the
    #: workers) uses a private PostgreSQL that is crashed and restarted, never the configured
    #: one, which other users of the machine share.
    postgres_restarts: int = 0
    #: Seconds that private PostgreSQL is stopped for, once, while steps are in flight (0: no
    #: outage); a web process is started to be asked what operators and customers see.
    postgres_outage_seconds: float = 0.0
    #: Which engine handles the refunds: the graph workflow, or the same refund as an agent run
    #: whose model is the sandbox's (the scripted planner over HTTP, counted).
    engine: str = "graph"
    #: The run's private broker: "redis" (no persistence) or "rabbitmq" (a node of its own).
    broker: str = "redis"
    #: "transaction" or "session": the workers reach Postgres through a private PgBouncer in
    #: that mode, with `pgbouncer_pool` server connections (fewer than the worker processes),
    #: and hold their liveness locks on a direct connection. "": straight to Postgres.
    pgbouncer: str = ""
    pgbouncer_pool: int = 3
    #: AGENTFLOW_PARTNER_LIMITS for the workers (JSON, "" none): issue 27's scenario.
    partner_limits: str = ""
    #: The sandbox's Stripe answers 429 past this many requests a second (0: no limit).
    stripe_rate: int = 0
    #: Customers erased (`agentflow_erase`) once the refunds have ended and before the ledger
    #: is read: the invariants must add up without their personal data (docs/privacy.md).
    erase: int = 0
    #: Stripe answers 503 to everything for this long, from `stripe_dark_after` seconds on.
    stripe_dark_seconds: float = 0.0
    stripe_dark_after: float = 5.0


#: Agent runs under chaos: the model answers slowly at times, fails, or its answer is lost.
MODEL_FAULTS: list[dict[str, Any]] = [
    {"endpoint": "llm.chat", "latency_ms": 50, "error_rate": 0.05, "drop_rate": 0.05},
]


def database_url() -> str:
    try:
        return current_database_url()
    except ValueError:
        raise ChaosError(
            "chaos needs Postgres: several worker processes write at once, and SQLite is the "
            "single-machine default only. Set DATABASE_URL=postgres://user@host:5432/name."
        ) from None


def run(config: ChaosConfig, *, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Run the whole experiment and return the report (see `refunds.chaos.report`)."""
    db_url = database_url()
    private = bool(config.postgres_restarts or config.postgres_outage_seconds)
    if not private:
        _refuse_leftovers()
    seed = config.seed if config.seed is not None else random.randrange(2**31)
    customers = traffic.customers(
        random.Random(f"{seed}-traffic"), config.refunds, today=airline_today()
    )
    if not private:
        _refuse_repeated_words(customers, seed)
    workdir = Path(settings.VAR_DIR) / "chaos" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    workdir.mkdir(parents=True)
    progress(f"chaos: seed {seed}, logs in {workdir}")
    doubles = _double_submits(random.Random(f"{seed}-doubles"), config)
    submissions: list[traffic.Submission] = []
    planned = _planned_kills(config)
    postgres: PostgresServer | None = None
    outage: DatabaseOutage | None = None
    # The customer whose form a database outage keeps, sent through the web process.
    kept = customers.pop() if config.postgres_outage_seconds and len(customers) > 1 else None
    with contextlib.ExitStack() as stack:
        if private:
            postgres = PostgresServer(workdir, dbname="chaos")
            stack.callback(postgres.stop)
            progress(f"chaos: private PostgreSQL on port {postgres.port} (log: postgres.log)")
            postgres.start()
            stack.enter_context(postgres.serving_django())
            # While it is down, the form answers 503 (or a query of this process fails) and the
            # customer sends again; the report counts those (submission_database_retries).
            stack.enter_context(logs.quieted("django.request", logging.CRITICAL))
            call_command("migrate", verbosity=0, interactive=False)
            db_url = postgres.url
        # Registered before anything that runs steps, so it runs after they stopped: unfinished
        # runs are cancelled while nothing of ours runs any more, or a later worker on this
        # database would resume them.
        stack.callback(
            _cancel_unfinished,
            submissions,
            "the chaos run stopped (interrupted, error or deadline)",
        )
        broker = (
            RabbitBroker(workdir / "rabbitmq")
            if config.broker == "rabbitmq"
            else RedisBroker(workdir)
        )
        stack.callback(broker.kill)
        progress(f"chaos: private {config.broker} broker on port {broker.port}")
        broker.start()
        liveness_url = ""
        if config.pgbouncer:
            bouncer = _pgbouncer_for(config, db_url, workdir)
            stack.callback(bouncer.stop)
            progress(
                f"chaos: PgBouncer {'.'.join(map(str, bouncer.version()))} in {config.pgbouncer} "
                f"mode on port {bouncer.port}, {config.pgbouncer_pool} server connections; "
                "liveness straight to Postgres"
            )
            db_url, liveness_url = bouncer.url_for(dj_database_url.parse(db_url)["NAME"]), db_url
        sandbox = Sandbox(workdir)
        stack.callback(sandbox.kill)
        sandbox.start({**os.environ, "AGENTFLOW_VAR_DIR": str(workdir)})
        env = _worker_env(config, db_url, broker, sandbox, workdir)
        if liveness_url:
            env["AGENTFLOW_LIVENESS_DATABASE_URL"] = liveness_url
        pool = WorkerPool(
            env=env, count=config.workers, concurrency=config.concurrency, log_dir=workdir
        )
        stack.callback(pool.kill_all)
        beat = Beat(workdir, env)
        stack.callback(beat.kill)
        progress(f"chaos: starting {config.workers} workers, beat, sandbox {sandbox.url}")
        partner_limits.forget(config.partner_limits)
        pool.start()
        beat.start()
        stack.enter_context(publishing_to(broker.url))
        stack.enter_context(_settings_for(config, sandbox))
        if postgres is not None and kept is not None:
            web = Web(workdir, {**env, "AGENTFLOW_METRICS_PUBLIC": "1"})
            stack.callback(web.kill)
            progress("chaos: starting a web process for the outage's pages")
            web.start()
            outage = DatabaseOutage(
                postgres=postgres,
                web=web,
                seconds=config.postgres_outage_seconds,
                after_runs=max(1, len(customers) // 2),
                customer=kept,
                progress=progress,
            )
            outage.prepare()
        if config.faults:
            sandbox.arm(FAULTS + (MODEL_FAULTS if config.engine == "agent" else []))
        if config.stripe_rate:
            sandbox.call("POST", "/_sandbox/limits", {"stripe": {"rate": config.stripe_rate}})
        if config.stripe_dark_seconds:
            stack.enter_context(
                partner_limits.stripe_dark(
                    sandbox,
                    after=config.stripe_dark_after,
                    seconds=config.stripe_dark_seconds,
                    faults=FAULTS if config.faults else [],
                    progress=progress,
                )
            )
        monkey = Monkey(
            rng=random.Random(f"{seed}-kills"), pool=pool, broker=broker, postgres=postgres
        )
        plan = monkey.plan(
            children=planned["children"],
            workers=planned["workers"],
            broker_restarts=planned["broker_restarts"],
            postgres_restarts=planned["postgres_restarts"],
        )
        t0 = time.time()
        if outage is not None:
            outage.start()
        finished = _drive(config, customers, doubles, submissions, monkey, plan, t0, progress)
        if outage is not None:
            deadline = t0 + config.timeout_seconds
            finished = _kept_form_finished(outage, submissions, deadline=deadline)
        erased = _erase(submissions, config.erase, progress)
        progress("chaos: reading the sandbox ledger and the database")
        found = evidence_mod.gather(
            [s.workflow_id for s in submissions if s.workflow_id], sandbox.ledger()
        )
        seen_by_partners = sandbox.call("GET", "/_sandbox/limits")
    result = report.build(
        evidence=found,
        submissions=submissions,
        kills=monkey.kills,
        planned_kills=planned,
        t0=t0,
        finished=finished,
        seed=seed,
        config={**asdict(config), "seed": seed, "logs": str(workdir)},
    )
    if config.partner_limits or config.stripe_rate or config.stripe_dark_seconds:
        result["partner_limits"] = partner_limits.report(found, seen_by_partners, t0, finished)
    if outage is not None:
        result["database_outage"] = outage_mod.report(outage.observed, found, workdir)
    if config.erase:
        result["erased"] = erased
    if config.cleanup and postgres is None:  # a private server's rows went with it
        _delete(submissions)
    return result


def _erase(
    submissions: list[traffic.Submission], count: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    """Erase the first `count` customers whose refund ended, as their GDPR request would."""
    ended = WorkflowRun.objects.filter(
        id__in=[s.workflow_id for s in submissions if s.workflow_id],
        status__in=TERMINAL_RUN_STATUSES,
    ).values_list("id", flat=True)
    done = set(ended)
    chosen = [s for s in submissions if s.workflow_id in done][:count]
    for submission in chosen:
        call_command(
            "agentflow_erase",
            subject=submission.customer.email,
            reason="chaos: a customer asked to be forgotten",
            actor="chaos",
            stdout=io.StringIO(),
        )
    progress(f"chaos: erased {len(chosen)} customers")
    return {"customers": len(chosen), "runs": [s.workflow_id for s in chosen]}


def _pgbouncer_for(config: ChaosConfig, db_url: str, workdir: Path) -> PgBouncerServer:
    parsed = dj_database_url.parse(db_url)
    if parsed.get("HOST") not in ("127.0.0.1", "localhost", ""):
        raise ChaosError(
            "--pgbouncer puts a PgBouncer on this machine in front of a local "
            f"Postgres, not {parsed.get('HOST')}"
        )
    return PgBouncerServer(
        workdir,
        upstream_port=int(parsed.get("PORT") or 5432),
        pool_mode=config.pgbouncer,
        pool_size=config.pgbouncer_pool,
    ).start()


def _planned_kills(config: ChaosConfig) -> dict[str, int]:
    children = config.child_kills
    if children is None:
        children = max(1, config.refunds // 15)
    return {
        "children": children,
        "workers": config.worker_kills,
        "broker_restarts": 1 if config.broker_restart else 0,
        "postgres_restarts": config.postgres_restarts,
    }


def _refuse_leftovers() -> None:
    """Our workers would resume any unfinished run in this database against our sandbox, and
    the report could not tell those effects from the chaos run's own."""
    leftovers = WorkflowRun.objects.filter(status__in=ACTIVE_RUN_STATUSES).count()
    if leftovers:
        raise ChaosError(
            f"{leftovers} unfinished workflow runs are in this database (an interrupted run, or "
            "another user of it). Chaos workers would resume them against the chaos sandbox and "
            "mix their effects into the report: finish or cancel them (admin), or use a "
            "database of its own."
        )


def _refuse_repeated_words(customers: list[traffic.Customer], seed: int) -> None:
    """A seed makes the same customers with the same words; sent again within the form's
    resubmit window, the form (rightly) answers with the earlier request, and this run would
    have nothing of its own to judge."""
    since = timezone.now() - RESUBMIT_WINDOW
    words = {(c.booking_reference, c.message) for c in customers}
    recent = RefundRequest.objects.filter(
        created_at__gt=since, booking_reference__in={b for b, _ in words}
    )
    # The words are sealed in their column (refunds.privacy): compared once read.
    repeated = sum((r.booking_reference, r.message) in words for r in recent)
    if repeated:
        minutes = int(RESUBMIT_WINDOW.total_seconds() // 60)
        raise ChaosError(
            f"seed {seed}'s customers sent these same words less than {minutes} minutes ago "
            f"({repeated} requests in this database). The form treats the same words within "
            f"{minutes} minutes as the same request, so this run would make no refunds of its "
            "own: use another --seed, wait, or a database of its own."
        )


def _cancel_unfinished(submissions: list[traffic.Submission], why: str) -> None:
    """Cancel (with an event saying why) every run of ours that is still active."""
    ids = [s.workflow_id for s in submissions if s.workflow_id]
    rows = WorkflowRun.objects.filter(id__in=ids, status__in=ACTIVE_RUN_STATUSES)
    for run_id, status, step in rows.values_list("id", "status", "current_step"):
        with contextlib.suppress(durable.ActionRefused):
            # The operator action the admin uses; durable.py has no cancel yet.
            durable.cancel(run_id, actor="chaos", reason=f"{why} while {status} at {step}")


def _double_submits(rng: random.Random, config: ChaosConfig) -> dict[int, str]:
    count = config.double_submits
    if count is None:
        count = max(1, config.refunds // 10)
    chosen = rng.sample(range(config.refunds), min(count, config.refunds))
    return {index: ("sequential", "concurrent")[n % 2] for n, index in enumerate(chosen)}


def _worker_env(
    config: ChaosConfig,
    db_url: str,
    broker: RedisBroker | RabbitBroker,
    sandbox: Sandbox,
    workdir: Path,
) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": db_url,
        "CELERY_BROKER_URL": broker.url,
        **({"REDIS_URL": broker.url} if config.broker == "redis" else {}),
        "SANDBOX_URL": sandbox.url,
        "SANDBOX_SMTP_PORT": str(sandbox.smtp_port),
        "STRIPE_API_BASE": sandbox.url,
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": str(sandbox.smtp_port),
        "REFUNDS_SUBMIT_LIMIT": "0",
        "REFUNDS_BOOKING_LIMIT": "0",
        "AGENTFLOW_VAR_DIR": str(workdir),
        "AGENTFLOW_LEASE_SECONDS": str(config.lease_seconds),
        "AGENTFLOW_SWEEP_INTERVAL": str(config.sweep_interval_seconds),
        "AGENTFLOW_FAULTS": "0",
        "AGENTFLOW_CRASH_AT": "",
        "AGENTFLOW_WORKFLOW_MODULES": "",
        "LOG_LEVEL": "INFO",
        "AGENTFLOW_LOG_FORMAT": "json",  # the report counts each process's ERROR lines
        "REFUNDS_ENGINE": config.engine,
        "AGENTFLOW_PARTNER_LIMITS": config.partner_limits,
        **(_model_env(sandbox) if config.engine == "agent" else {}),
    }


def _model_env(sandbox: Sandbox) -> dict[str, str]:
    """Agent runs ask the sandbox's model, through the real SDK, so its requests are counted."""
    from refunds.agent.planner import MODEL

    return {
        "AGENTFLOW_LLM_BASE_URL": f"{sandbox.url}/v1",
        "AGENTFLOW_LLM_MODEL": MODEL,
        "AGENTFLOW_LLM_API_KEY": "sk-chaos-sandbox",
    }


def _settings_for(config: ChaosConfig, sandbox: Sandbox) -> override_settings:
    """This process serves the form (and starts runs); the test client calls itself testserver."""
    return override_settings(
        ALLOWED_HOSTS=[*settings.ALLOWED_HOSTS, "testserver"],
        REFUNDS_SUBMIT_LIMIT=0,
        REFUNDS_BOOKING_LIMIT=0,
        SANDBOX_URL=sandbox.url,
        SANDBOX_SMTP_PORT=sandbox.smtp_port,
        STRIPE_API_BASE=sandbox.url,
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=sandbox.smtp_port,
        AGENTFLOW_LEASE_SECONDS=config.lease_seconds,
        AGENTFLOW_SWEEP_INTERVAL=config.sweep_interval_seconds,
        REFUNDS_ENGINE=config.engine,
    )


def _drive(
    config: ChaosConfig,
    customers: list[traffic.Customer],
    doubles: dict[int, str],
    submissions: list[traffic.Submission],
    monkey: Monkey,
    plan: list[str],
    t0: float,
    progress: Callable[[str], None],
) -> float:
    """Send the refunds at a steady rate (into `submissions`) and kill on schedule until every
    run has finished (or parked), or the deadline passes. Returns when it ended."""
    deadline = t0 + config.timeout_seconds
    next_kill = t0 + monkey.rng.uniform(0.5, 1.5) * config.kill_interval_seconds
    next_poll = next_report = 0.0
    active = len(customers)
    while True:
        now = time.time()
        while len(submissions) < len(customers) and now >= t0 + len(submissions) / max(
            config.submit_per_second, 0.001
        ):
            index = len(submissions)
            submissions.append(
                traffic.submit(
                    customers[index],
                    double=doubles.get(index, ""),
                    outage_seconds=config.postgres_outage_seconds,
                )
            )
            now = time.time()
        sending = len(submissions) < len(customers)
        if now >= next_poll:
            polled = _active([s.workflow_id for s in submissions if s.workflow_id])
            active = active if polled is None else polled
            next_poll = now + POLL_SECONDS
        if not sending and active == 0:
            return now
        if now > deadline:
            progress(f"chaos: deadline reached with {active} runs unfinished")
            return now
        if plan and now >= next_kill:
            kind = plan.pop(0)
            kill = monkey.act(kind)
            if kill is not None:
                progress(
                    f"chaos: [{kill.at - t0:6.1f}s] killed {kind} {kill.pids} "
                    f"({len(kill.leased) or len(kill.lost_messages)} steps in flight)"
                )
            next_kill = time.time() + monkey.rng.uniform(0.5, 1.5) * config.kill_interval_seconds
        if now >= next_report:
            progress(
                f"chaos: [{now - t0:6.1f}s] sent {len(submissions)}/{len(customers)}, "
                f"unfinished {active}, kills {len(monkey.kills)}"
            )
            next_report = now + PROGRESS_SECONDS
        time.sleep(0.02 if sending else 0.1)


def _kept_form_finished(
    outage: DatabaseOutage, submissions: list[traffic.Submission], *, deadline: float
) -> float:
    """The outage is over (its thread ends once the kept form is sent again); that form's run
    joins the others and is waited for like them. Returns when it ended."""
    observed = outage.finish(timeout=max(deadline - time.time(), 1.0))
    if observed.submission is not None:
        submissions.append(observed.submission)
        ids = [observed.submission.workflow_id] if observed.submission.workflow_id else []
        while ids and _active(ids) != 0 and time.time() < deadline:
            time.sleep(POLL_SECONDS)
    return time.time()


def _active(workflow_ids: list[str]) -> int | None:
    """Runs still active; None while the database does not answer (it is being restarted)."""
    try:
        return WorkflowRun.objects.filter(
            id__in=workflow_ids, status__in=ACTIVE_RUN_STATUSES
        ).count()
    except DatabaseError:
        connections.close_all()  # the dead connection goes; the next poll opens a new one
        return None


def _delete(submissions: list[traffic.Submission]) -> None:
    durable.delete_runs(s.workflow_id for s in submissions if s.workflow_id)
    RefundRequest.objects.filter(public_id__in=[s.public_id for s in submissions]).delete()
