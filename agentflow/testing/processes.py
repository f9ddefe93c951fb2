"""Real processes on demand for `bench`, `chaos` and the crash tests: Celery workers, and a
private Redis, PostgreSQL and PgBouncer that can be crashed without touching the machine's own.

Each worker is a separate `celery -A <project> worker` process group that can be killed whole
or one prefork child at a time, exactly as an OOM killer or `kill -9` would.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

import dj_database_url
import kombu.pools
import psycopg

try:
    import redis
except ImportError as missing:  # the private Redis needs its client: the `testing` extra
    raise ImportError(
        "agentflow.testing needs redis: pip install 'django-agentflow[testing]'"
    ) from missing
from celery import current_app
from django.conf import settings
from django.db import connection, connections


class ProcessStartError(RuntimeError):
    pass


def _until_ready(
    ready: Callable[[], bool],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    on_timeout: Callable[[], None] | None = None,
) -> None:
    """Poll a server just started until it answers; ProcessStartError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            if on_timeout is not None:
                on_timeout()
            raise ProcessStartError(f"{what} not ready in {timeout} s")
        time.sleep(interval)


#: Ports this process has handed out: never handed out twice, since the server meant to bind
#: one may not have yet when the next is asked for.
_handed_out: set[int] = set()


def free_port(*, pair: bool = False) -> int:
    """A free TCP port on 127.0.0.1; with `pair`, one whose successor is free too (HTTP + SMTP).

    Chosen below the kernel's ephemeral range: the server that will bind it starts seconds
    later, and meanwhile any outgoing connection (to Postgres, Redis, ...) may take an
    ephemeral port, which made a sandbox fail with "address already in use". Suites run in
    shards give each its own range (`AGENTFLOW_TEST_PORTS=low-high`), so two never race for one.
    """
    low, high = _port_range()
    for _ in range(200):
        port = random.randrange(low, high)
        wanted = (port, port + 1) if pair else (port,)
        if _handed_out.isdisjoint(wanted) and all(_bindable(each) for each in wanted):
            _handed_out.update(wanted)
            return port
    raise ProcessStartError("no free port (pair)" if pair else "no free port")


def _port_range() -> tuple[int, int]:
    configured = os.environ.get("AGENTFLOW_TEST_PORTS", "")
    if configured:
        low_text, _, high_text = configured.partition("-")
        return int(low_text), int(high_text) - 1  # the pair's second port stays in range
    return 10_000, max(10_002, _ephemeral_low() - 1)


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class RedisServer:
    """A private `redis-server` that keeps nothing across a restart (`--save ''`, no AOF):
    what a broker without persistence loses, a test or the chaos run can make it lose."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        binary = shutil.which("redis-server")
        if binary is None:
            raise ProcessStartError("redis-server is not installed (apt-get install redis-server)")
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--daemonize",
            "no",
            "--logfile",
            str(self.workdir / "redis.log"),
        ]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, start_new_session=True)
        _until_ready(self._pong, timeout=15, what=f"redis-server on port {self.port}")
        return self

    def _pong(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessStartError(f"redis-server exited: see {self.workdir / 'redis.log'}")
        try:
            return bool(self.client().ping())
        except redis.ConnectionError:
            return False

    def kill(self) -> None:
        """SIGKILL: nothing is saved, whatever was queued or unacknowledged is gone."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """Kill and start again on the same port, empty: every message is lost."""
        self.kill()
        self.start()

    def queue_length(self, queue: str = "celery") -> int:
        return int(self.client().llen(queue))

    def queued_messages(self, queue: str = "celery") -> list[Any]:
        """Every message waiting in `queue`, in each of kombu's priority lists (a message with
        a priority waits in `<queue><sep><step>`, docs/workflows.md, "Priorities")."""
        from celery import current_app

        options = current_app.conf.broker_transport_options or {}
        sep = options.get("sep", "\x06\x16")
        names = [
            queue,
            *(f"{queue}{sep}{step}" for step in options.get("priority_steps", ()) if step),
        ]
        client = self.client()
        return [message for name in names for message in client.lrange(name, 0, -1)]


class RabbitMQServer:
    """A private RabbitMQ node (its own node name, ports and data directory), so a test can
    crash and restart a broker without touching the machine's. Queues are Celery's default:
    durable, messages persistent. `kill()` is SIGKILL: what the node had not yet written to
    disk is lost, exactly what publisher confirms guard against."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.dist_port = free_port()
        self.workdir = workdir
        self.node = f"agentflow-{self.port}@localhost"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def start(self, *, timeout: float = 60.0) -> Self:
        # The script itself: Debian's /usr/sbin wrapper switches to the rabbitmq user, who
        # cannot write our directory.
        binary = "/usr/lib/rabbitmq/bin/rabbitmq-server"
        if not Path(binary).exists():
            binary = shutil.which("rabbitmq-server") or binary
        if not Path(binary).exists():
            raise ProcessStartError(
                "rabbitmq-server is not installed (apt-get install rabbitmq-server)"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "enabled_plugins").write_text("[].\n")
        (self.workdir / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = 127.0.0.1:{self.port}\nloopback_users = none\n"
        )
        env = {
            **os.environ,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.workdir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.workdir / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.workdir / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.workdir / "rabbitmq"),
            "RABBITMQ_PID_FILE": str(self.workdir / "rabbitmq.pid"),
        }
        with open(self.workdir / "rabbitmq.out", "ab") as log:
            self.proc = subprocess.Popen(
                [binary],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.workdir,
            )
        _until_ready(
            self._answers,
            timeout=timeout,
            what=f"rabbitmq on port {self.port}",
            interval=0.1,
            on_timeout=self.kill,
        )
        return self

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessStartError(f"rabbitmq exited: see {self.workdir / 'rabbitmq.out'}")
        from kombu import Connection

        try:
            with Connection(self.url, connect_timeout=1) as conn:
                conn.connect()
        except OSError:
            return False
        except Exception:  # amqp's own errors while the node is still booting
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the node's whole process group."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """Kill and start again on the same ports and data: durable queues come back with the
        persistent messages the node had written; unacknowledged ones are ready again."""
        self.kill()
        self.start()

    def queue_length(self, queue: str = "celery") -> int:
        return rabbitmq_queue_length(self.url, queue)


def rabbitmq_queue_length(url: str, queue: str = "celery") -> int:
    """Ready messages in `queue` (0 if it does not exist yet)."""
    from kombu import Connection

    with Connection(url, connect_timeout=5) as conn:
        try:
            return int(conn.default_channel.queue_declare(queue, passive=True).message_count)
        except Exception as exc:  # NOT_FOUND closes the channel
            if "NOT_FOUND" in str(exc):
                return 0
            raise


def rabbitmq_purge(url: str, queues: tuple[str, ...] = ("celery",)) -> None:
    """Empty `queues` that exist (a test's broker starts empty, as a private Redis does)."""
    from kombu import Connection

    with Connection(url, connect_timeout=5) as conn:
        for queue in queues:
            channel = conn.channel()
            try:
                channel.queue_purge(queue)
            except Exception as exc:
                if "NOT_FOUND" not in str(exc):
                    raise
            finally:
                with contextlib.suppress(Exception):
                    channel.close()


class PostgresServer:
    """A private PostgreSQL server that a test or chaos run may crash and restart at will.

    The machine's binaries (`/usr/lib/postgresql/*/bin`, else PATH) initdb a data directory
    in a temporary directory; it serves 127.0.0.1 on a free port with trust auth. The shared
    server that other test runs use is never touched. Run as the `postgres` user when this
    process is root (initdb refuses root). fsync is off: `crash()` kills processes, not the
    machine, so the OS still holds every write; crash recovery replays the WAL as after a
    real crash.
    """

    def __init__(self, workdir: Path, *, dbname: str = "agentflow") -> None:
        self.port = free_port()
        self.workdir, self.dbname = workdir, dbname
        self.log_path = workdir / "postgres.log"
        self.base: Path | None = None  # the temporary directory: data and socket
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.dbname}"

    @property
    def postmaster_pid(self) -> int:
        assert self.proc is not None, "postgres is not running"
        return self.proc.pid

    def start(self, *, timeout: float = 60.0) -> Self:
        """initdb on first use (and create the database), then start and wait until it
        accepts connections, crash recovery included."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        fresh = self.base is None
        if fresh:
            self.base = Path(tempfile.mkdtemp(prefix="agentflow-pg-"))
            self._run_as_owner(
                [
                    _pg_binary("initdb"),
                    "-D",
                    str(self.base / "data"),
                    "-U",
                    "postgres",
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-locale",
                    "--no-sync",
                ],
                wait=True,
            )
        assert self.base is not None
        self.proc = self._run_as_owner(
            [
                _pg_binary("postgres"),
                "-D",
                str(self.base / "data"),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={self.base}",
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=200",
            ]
        )
        _until_ready(self._accepts, timeout=timeout, what=f"postgres on port {self.port}")
        if fresh:
            with self.connect("postgres") as conn:
                conn.execute(f'CREATE DATABASE "{self.dbname}"')
        return self

    def connect(self, dbname: str | None = None) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1",
            port=self.port,
            user="postgres",
            dbname=dbname or self.dbname,
            connect_timeout=5,
            autocommit=True,
        )

    @contextlib.contextmanager
    def serving_django(self) -> Iterator[None]:
        """This process's default database is this server until exit, for every thread's next
        connection: the settings dict is shared by the alias's connection objects (as when
        pytest-django renames the database). Options (timeouts, prepared statements) stay."""
        db = connection.settings_dict
        saved = {key: db[key] for key in ("NAME", "HOST", "PORT", "USER", "PASSWORD")}
        connections.close_all()
        db.update(NAME=self.dbname, HOST="127.0.0.1", PORT=str(self.port), USER="postgres")
        db["PASSWORD"] = ""
        try:
            yield
        finally:
            connections.close_all()
            db.update(saved)

    def crash(self) -> None:
        """SIGKILL the postmaster and every backend at once: no shutdown checkpoint, clients
        see their connections reset, and the next start runs crash recovery."""
        if self.proc is None:
            return
        postmaster, children = self.proc.pid, []
        with contextlib.suppress(ProcessLookupError):
            os.kill(postmaster, signal.SIGSTOP)  # no new backend forks while we look
            children = _children_of(postmaster)
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os.kill(postmaster, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None
        # A backend still attached to shared memory would make the next start refuse.
        deadline = time.monotonic() + 10
        while any(_running(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.01)

    def restart(self) -> None:
        """Crash, then start again on the same port and data directory."""
        self.crash()
        self.start()

    def halt(self, *, timeout: float = 30.0) -> None:
        """Stop the server as an administrator does (fast shutdown: every session is ended
        with "terminating connection due to administrator command", a checkpoint is written),
        keeping its data for `start()` on the same port."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.crash()
        self.proc = None

    def stop(self) -> None:
        """Stop (fast shutdown, SIGKILL if slow) and remove the data directory."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.crash()
            self.proc = None
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    def _accepts(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessStartError(f"postgres exited: see {self.log_path}")
        try:
            self.connect("postgres").close()
        except psycopg.OperationalError:
            return False
        return True

    def _run_as_owner(self, args: list[str], *, wait: bool = False) -> subprocess.Popen[bytes]:
        """Run a server binary as `postgres` if we are root (initdb refuses root)."""
        assert self.base is not None
        owner: dict[str, Any] = {}
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError:
                raise ProcessStartError(
                    "PostgreSQL refuses to run as root, and there is no postgres user"
                ) from None
            owner = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
            os.chown(self.base, account.pw_uid, account.pw_gid)
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.base,
                **owner,
            )
        if wait and proc.wait(timeout=120) != 0:
            raise ProcessStartError(f"{Path(args[0]).name} failed: see {self.log_path}")
        return proc


class PgBouncerServer:
    """A private PgBouncer in front of a Postgres server, the way teams pool connections.

    `pool_mode="transaction"` hands each transaction a server connection of its own choosing:
    a prepared statement, a session `SET` or an advisory lock taken by one client can turn up
    under another. `pool_size` below the number of clients makes them queue for a server
    connection, as in production. `max_prepared_statements` is passed only when given (the
    setting exists from 1.21 on; Debian 12 ships 1.18). `options` (the lock and idle timeouts
    Django sends at connect) is among the startup parameters it ignores, as teams configure
    it: PgBouncer before 1.20 refuses a client that sends it otherwise.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        upstream_port: int,
        pool_mode: str = "transaction",
        pool_size: int = 4,
        max_prepared_statements: int | None = None,
    ) -> None:
        self.port = free_port()
        self.workdir, self.upstream_port = workdir, upstream_port
        self.pool_mode, self.pool_size = pool_mode, pool_size
        self.max_prepared_statements = max_prepared_statements
        self.log_path = workdir / "pgbouncer.log"
        self.base: Path | None = None  # its configuration, owned by the user it runs as
        self.proc: subprocess.Popen[bytes] | None = None

    def url_for(self, dbname: str, user: str = "postgres") -> str:
        return f"postgres://{quote(user, safe='')}@127.0.0.1:{self.port}/{quote(dbname, safe='')}"

    def version(self) -> tuple[int, ...]:
        out = subprocess.run([_pgbouncer_binary(), "--version"], capture_output=True, text=True)
        words = (out.stdout or "").split()
        numbers = words[1] if len(words) > 1 and words[0] == "PgBouncer" else "0"
        return tuple(int(part) for part in numbers.split(".") if part.isdigit())

    def start(self, *, timeout: float = 15.0) -> Self:
        """Write its configuration into a directory of its own (readable by the `postgres`
        user it runs as when we are root), start it and wait until it answers."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.base is None:
            self.base = Path(tempfile.mkdtemp(prefix="agentflow-pgbouncer-"))
        ini, users = self.base / "pgbouncer.ini", self.base / "userlist.txt"
        users.write_text('"postgres" ""\n')
        lines = [
            "[databases]",
            f"* = host=127.0.0.1 port={self.upstream_port}",
            "[pgbouncer]",
            "listen_addr = 127.0.0.1",
            f"listen_port = {self.port}",
            "unix_socket_dir =",
            "auth_type = trust",
            f"auth_file = {users}",
            f"pool_mode = {self.pool_mode}",
            f"default_pool_size = {self.pool_size}",
            "min_pool_size = 0",
            "reserve_pool_size = 0",
            "max_client_conn = 500",
            "ignore_startup_parameters = extra_float_digits,options",
        ]
        if self.max_prepared_statements is not None:
            lines.append(f"max_prepared_statements = {self.max_prepared_statements}")
        ini.write_text("\n".join(lines) + "\n")
        owner = _postgres_owner()
        if owner:
            for path in (self.base, ini, users):
                os.chown(path, owner["user"], owner["group"])
        with open(self.log_path, "ab") as log:  # it logs to stderr when not daemonized
            self.proc = subprocess.Popen(
                [_pgbouncer_binary(), str(ini)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.base,
                **owner,
            )
        _until_ready(self._accepts, timeout=timeout, what=f"pgbouncer on port {self.port}")
        return self

    def _accepts(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise ProcessStartError(f"pgbouncer exited: see {self.log_path}")
        try:
            psycopg.connect(
                host="127.0.0.1",
                port=self.port,
                user="postgres",
                dbname="postgres",
                connect_timeout=2,
                autocommit=True,
            ).close()
        except psycopg.OperationalError:
            return False
        return True

    def stop(self) -> None:
        """SIGKILL: every client connection through it breaks at once."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or shutil.which("/usr/sbin/pgbouncer")
    if found is None:
        raise ProcessStartError("pgbouncer is not installed (apt-get install pgbouncer)")
    return found


def _postgres_owner() -> dict[str, Any]:
    """Popen arguments that run a server as `postgres` when we are root (PgBouncer and
    PostgreSQL both refuse root)."""
    if os.geteuid() != 0:
        return {}
    try:
        account = pwd.getpwnam("postgres")
    except KeyError:
        raise ProcessStartError(
            "the server refuses to run as root, and there is no postgres user"
        ) from None
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _pg_binary(name: str) -> str:
    """The newest installed PostgreSQL's `name`, else the one on PATH."""
    versions = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
        key=lambda path: int(path.parts[-3]) if path.parts[-3].isdigit() else 0,
    )
    found = str(versions[-1]) if versions else shutil.which(name)
    if found is None:
        raise ProcessStartError(
            f"PostgreSQL's {name} is not installed (apt-get install postgresql)"
        )
    return found


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie holds no memory, so it blocks nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def current_database_url() -> str:
    """This process's effective Postgres database as a URL a worker can use.

    Under pytest that is the test database (pytest-django renames it), not the one
    DATABASE_URL names. Raises ValueError on other databases: several worker processes
    writing at once need Postgres.
    """
    db = connection.settings_dict
    if db["ENGINE"] != "django.db.backends.postgresql":
        raise ValueError(f"worker processes need Postgres, not {db['ENGINE'].rsplit('.', 1)[-1]}")
    configured = os.environ.get("DATABASE_URL", "")
    if configured and dj_database_url.parse(configured).get("NAME") == db["NAME"]:
        return configured  # unchanged, with any options it carries
    auth = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        auth += ":" + quote(db["PASSWORD"], safe="")
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgres://{auth}@{db['HOST'] or 'localhost'}{port}/{quote(db['NAME'], safe='')}"


@contextlib.contextmanager
def publishing_to(url: str) -> Iterator[None]:
    """This process's Celery app publishes to `url` (a private broker) until exit, then to the
    broker it had. See `point_app_at`."""
    app = current_app._get_current_object()
    previous = app.conf.broker_write_url or app.conf.broker_url
    point_app_at(url)
    try:
        yield
    finally:
        point_app_at(previous)


def point_app_at(url: str) -> None:
    """Make this process's Celery app publish to `url`; every cached pool goes.

    Celery resolves `broker_write_url`/`broker_read_url` once, so those are what must change.
    kombu keeps its connection and producer pools per URL for the whole process
    (`kombu.pools`): they are closed *and forgotten* together, since a pool closed but still
    in kombu's group is handed out again and fails every publish ("Acquire on closed pool").
    """
    app = current_app._get_current_object()
    app.conf.broker_url = app.conf.broker_write_url = app.conf.broker_read_url = url
    kombu.pools.reset()
    app._pool = None
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


def _children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


class WorkerProcess:
    """One `celery worker` (a parent plus its prefork children) with its log in a file."""

    def __init__(
        self,
        *,
        concurrency: int = 1,
        env: Mapping[str, str] | None = None,
        name: str | None = None,
        log_dir: Path | None = None,
        beat: bool = False,
        extra_args: list[str] | None = None,
        wrapper: list[str] | None = None,
        app: str | None = None,
        cwd: Path | None = None,
    ) -> None:
        """`app`: what `celery -A` loads (default: this process's current Celery app, by its
        main name, which is the project package per Celery's Django guide). `wrapper`: a
        command the worker runs under, e.g. `unshare --pid --fork --mount-proc` for a PID
        namespace of its own (its pool children are then the wrapped worker's)."""
        self.name = name or f"w{uuid.uuid4().hex[:8]}"
        self.wrapper = wrapper or []
        self.concurrency = concurrency
        self.env = {**os.environ, **(env or {})}
        self.app = app or current_app.main
        self.cwd = cwd or Path(getattr(settings, "BASE_DIR", Path.cwd()))
        self.beat = beat
        self.extra_args = extra_args or []
        log_dir = log_dir or Path(getattr(settings, "VAR_DIR", tempfile.gettempdir())) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{self.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout: float = 30.0) -> WorkerProcess:
        args = [
            *self.wrapper,
            sys.executable,
            "-m",
            "celery",
            "-A",
            self.app,
            "worker",
            "-P",
            "prefork",
            "-c",
            str(self.concurrency),
            "-n",
            f"{self.name}@%h",
            "--without-mingle",
            "--without-gossip",
            "-l",
            "info",
            *(["-B", "-s", str(self.log_path.with_suffix(".beat"))] if self.beat else []),
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                args,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: killpg reaches every child
                cwd=self.cwd,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ProcessStartError(f"worker {self.name} exited: {self.log_tail()}")
            if (
                b" ready." in self.log_path.read_bytes()
                and len(self.children()) >= self.concurrency
            ):
                return self
            time.sleep(0.05)
        self.kill()
        raise ProcessStartError(f"worker {self.name} not ready in {timeout} s: {self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None, "worker not started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def children(self) -> list[int]:
        """Pids of the prefork pool processes (as this host's root namespace numbers them)."""
        if not self.alive():
            return []
        main = self.pid
        if self.wrapper:
            wrapped = _children_of(main)
            if not wrapped:
                return []
            main = wrapped[0]
        return _children_of(main)

    def kill_child(self, pid: int | None = None) -> int:
        """SIGKILL one pool process (the first, or `pid`); the parent replaces it."""
        victims = [pid] if pid else self.children()[:1]
        if not victims:
            raise RuntimeError(f"worker {self.name} has no children to kill")
        os.kill(victims[0], signal.SIGKILL)
        return victims[0]

    def kill(self) -> None:
        """SIGKILL the whole worker: parent and children, no shutdown handlers run."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, *, timeout: float = 15.0) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL if it takes too long."""
        if not self.alive():
            return
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.kill()
