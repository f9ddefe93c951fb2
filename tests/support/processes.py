"""Real processes for engine tests: a private Redis, the partner file, and worker factories.

Fixtures:
- `redis_server` (session): a private `redis-server` on a free port, without persistence, that
  a test may stop, kill or restart (everything in it is lost, like a broker restart in prod).
- `infra`: what the workers run on, "redis" unless a test is parametrized (indirect) over
  `INFRA`: "rabbitmq" (the machine's RabbitMQ, TEST_RABBITMQ_URL), "pgbouncer" (Redis, and the
  database through a private PgBouncer in transaction mode with fewer server connections than
  clients; liveness straight to Postgres, as docs/production.md says).
- `broker`: points this process's Celery app at the test's broker for one test, emptied first.
- `partner_db`: a fresh partner file; `TEST_PARTNER_DB` names it for this process and workers.
- `worker_env`: builds a worker's environment (test database, private broker, test workflows).
- `workers`: starts `agentflow.testing.processes.WorkerProcess`es, SIGKILLs each at teardown,
  before the test database is flushed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dj_database_url
import pytest
from django.conf import settings

from agentflow._core import leases
from agentflow._store import builds as store_builds
from agentflow.testing.processes import (
    PgBouncerServer,
    ProcessStartError,
    RedisServer,
    WorkerProcess,
    current_database_url,
    publishing_to,
    rabbitmq_purge,
    rabbitmq_queue_length,
)
from tests.support import partner

WORKFLOW_MODULES = "tests.support.workflows"


@pytest.fixture(autouse=True)
def _liveness_released() -> Iterator[None]:
    """A test that claimed a step in this process took a liveness connection to the test
    database; it is closed after the test, so the database can be dropped at the end. The
    builds this process recorded went with the test's rows: it records them again."""
    yield
    leases.release()
    store_builds._known.clear()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


#: The machine's RabbitMQ; a vhost of the suite's own keeps parallel suites apart.
RABBITMQ_URL = os.environ.get("TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
#: What a test's workers can run on (see `infra`).
INFRA = ("redis", "rabbitmq", "pgbouncer")
#: Server connections PgBouncer gives the test database: fewer than the clients (worker pool
#: processes, beat), so they wait for one another as in production.
PGBOUNCER_POOL_SIZE = 2


def _unavailable(what: str) -> None:
    """Skip, except under CI=true, where a missing service is a failure."""
    if os.environ.get("CI") == "true":
        pytest.fail(what)
    pytest.skip(what)


@pytest.fixture
def infra(request: pytest.FixtureRequest) -> str:
    return str(getattr(request, "param", "redis"))


class MachineRabbitMQ:
    """The machine's RabbitMQ as a test's broker: what a test asks of a broker, except
    restarting it (other users share it; `agentflow.testing.processes.RabbitMQServer` is a
    private node that may be crashed)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.proc = None

    def queue_length(self, queue: str = "celery") -> int:
        return rabbitmq_queue_length(self.url, queue)

    def flush(self) -> None:
        rabbitmq_purge(self.url)
        # The shared step queue and the suite build's own (docs/deploys.md): both declared
        # with x-max-priority today.
        for queue in ("celery", f"agentflow.build.{os.environ.get('AGENTFLOW_BUILD_ID', 'suite')}"):
            _drop_queue_declared_otherwise(self.url, queue)


def _drop_queue_declared_otherwise(url: str, queue: str = "celery") -> None:
    """A step queue declared before x-max-priority was (an older suite on this vhost) would
    refuse every declare of today's settings (PRECONDITION_FAILED): it goes, empty."""
    from kombu import Connection

    with Connection(url, connect_timeout=5) as conn:
        channel = conn.channel()
        try:
            channel.queue_declare(
                queue,
                durable=True,
                auto_delete=False,
                arguments={"x-max-priority": settings.CELERY_TASK_QUEUE_MAX_PRIORITY},
            )
        except Exception as exc:
            if "PRECONDITION_FAILED" not in str(exc):
                raise
            conn.channel().queue_delete(queue)
        else:
            with contextlib.suppress(Exception):
                channel.close()


@pytest.fixture
def broker(infra: str, redis_server: RedisServer) -> Iterator[Any]:
    """This test publishes to its broker, emptied first; the old broker comes back after."""
    server: Any
    if infra == "rabbitmq":
        server = MachineRabbitMQ(RABBITMQ_URL)
        try:
            server.flush()
        except OSError as exc:
            _unavailable(f"RabbitMQ does not answer at {RABBITMQ_URL}: {exc}")
    else:
        if redis_server.proc is None or redis_server.proc.poll() is not None:
            redis_server.start()
        redis_server.client().flushall()
        server = redis_server
    with publishing_to(server.url):
        yield server
    if infra == "rabbitmq":
        server.flush()  # nothing of this test is left for the next one's workers


@pytest.fixture(scope="session")
def pgbouncer_server(
    tmp_path_factory: pytest.TempPathFactory, django_db_setup: None
) -> Iterator[PgBouncerServer]:
    """A private PgBouncer in transaction mode in front of the test database's server."""
    from django.db import connection

    port = int(connection.settings_dict["PORT"] or 5432)
    server = PgBouncerServer(
        tmp_path_factory.mktemp("pgbouncer"), upstream_port=port, pool_size=PGBOUNCER_POOL_SIZE
    )
    try:
        server.start()
    except ProcessStartError as exc:
        server.stop()
        _unavailable(f"no PgBouncer here: {exc}")
    yield server
    server.stop()


@pytest.fixture
def partner_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "partner.sqlite3"
    partner.create(path)
    monkeypatch.setenv("TEST_PARTNER_DB", str(path))
    return path


def worker_database_url() -> str:
    """The database pytest-django created (it renames NAME), as a URL a worker can use."""
    try:
        return current_database_url()
    except ValueError:
        pytest.skip("worker tests need Postgres (set DATABASE_URL)")


EnvBuilder = Callable[..., dict[str, str]]


@pytest.fixture
def worker_env(
    infra: str,
    broker: Any,
    partner_db: Path,
    transactional_db: None,
    request: pytest.FixtureRequest,
) -> EnvBuilder:
    """`worker_env(AGENTFLOW_LEASE_SECONDS="2", ...)`: a worker's environment, overrides last."""
    database = worker_database_url()
    pooled: dict[str, str] = {}
    if infra == "pgbouncer":
        bouncer: PgBouncerServer = request.getfixturevalue("pgbouncer_server")
        name = dj_database_url.parse(database)["NAME"]
        pooled = {
            "DATABASE_URL": bouncer.url_for(name),
            "AGENTFLOW_LIVENESS_DATABASE_URL": database,  # advisory locks need a session
        }

    def build(**overrides: str) -> dict[str, str]:
        env = {
            "DATABASE_URL": database,
            "CELERY_BROKER_URL": broker.url,
            "REDIS_URL": broker.url,
            "AGENTFLOW_WORKFLOW_MODULES": WORKFLOW_MODULES,
            "AGENTFLOW_VAR_DIR": str(settings.VAR_DIR),
            "TEST_PARTNER_DB": str(partner_db),
            "AGENTFLOW_FAULTS": "0",
            "AGENTFLOW_CRASH_AT": "",
            "AGENTFLOW_LEASE_SECONDS": "10",
            "AGENTFLOW_SWEEP_INTERVAL": "5",
            "LOG_LEVEL": "INFO",
            **pooled,
        }
        env.update(overrides)
        return env

    return build


class Workers:
    """Starts workers for one test and guarantees none outlives it."""

    def __init__(self, build_env: EnvBuilder, prefix: str) -> None:
        self._build_env = build_env
        self._prefix = prefix
        self.started: list[WorkerProcess] = []

    def start(
        self,
        *,
        concurrency: int = 1,
        beat: bool = False,
        env: dict[str, str] | None = None,
        wrapper: list[str] | None = None,
        queues: str | None = None,
        **overrides: Any,
    ) -> WorkerProcess:
        """Start one worker and wait until it is ready; `overrides` go into its env."""
        full_env = env if env is not None else self._build_env(**overrides)
        name = f"{self._prefix}{len(self.started) + 1}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
        worker = WorkerProcess(
            concurrency=concurrency,
            env=full_env,
            name=name,
            beat=beat,
            wrapper=wrapper,
            extra_args=["-Q", queues] if queues else None,
        )
        self.started.append(worker)
        return worker.start(timeout=60)

    def signal(self, worker: WorkerProcess, sig: signal.Signals) -> None:
        """Send `sig` to the worker's whole process group (parent, pool, beat)."""
        os.killpg(worker.pid, sig)

    def kill_all(self) -> None:
        for worker in self.started:
            if worker.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.pid, signal.SIGCONT)  # a stopped group dies cleaner awake
            worker.kill()


@pytest.fixture
def workers(worker_env: EnvBuilder, request: pytest.FixtureRequest) -> Iterator[Workers]:
    pool = Workers(worker_env, prefix="crash")
    yield pool
    pool.kill_all()


def log_has(worker: WorkerProcess, text: str) -> bool:
    try:
        return text in worker.log_path.read_text(errors="replace")
    except OSError:
        return False
