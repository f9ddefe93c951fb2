"""Issue 16's contract, end to end, as a Django team adopts agentflow: the wheel built from this
checkout, installed in a fresh venv exactly as the docs tell a host on Redis to install it
(`pip install 'django-agentflow[redis]'`, every dependency resolved from the package index, no
lock),
a `django-admin startproject shop` with an `orders` app whose `workflows.py` ships an order
through a partner table keyed by the idempotency key, and the settings the contract allows
and nothing else. A run survives a worker SIGKILLed after its effect under the host's own
`celery -A shop worker` and `celery -A shop beat` on the machine's Redis; the admin shows it;
then the host adds its test tools and its own suite uses `agentflow.testing`.

Every command runs in the fresh venv with a clean environment (none of this repository's
settings, broker or database variables), in a database and Redis database of its own. Each
phase's time, and the versions the host ended up with, are printed at the end of the session.

`make test-matrix` (noxfile.py) runs this once per supported stack: HOST_PYTHON makes the venv,
and HOST_STACK is the Django, Celery, kombu and psycopg the host already runs, installed before
the docs' line (which must keep them).
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dj_database_url
import psycopg
import pytest
import redis
from packaging.requirements import Requirement

from agentflow.testing.waiting import wait_for

pytestmark = pytest.mark.host

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
#: What the docs tell a host on Redis to install: `pip install 'django-agentflow[redis]'`
#: (README, "In your own project"). The wheel stands in for the name on the index; all else
#: comes from it.
EXTRAS = "redis"
#: The host's own test tools: the extra agentflow.testing needs, and the two tools the docs'
#: testing section names. Installed only once the worker has run on the docs' line alone:
#: pytest brings `packaging` and the `testing` extra the redis client, the two things a host
#: without `[redis]` lacks, so installed first they would hide a missing `[redis]`.
TEST_TOOLS_EXTRAS = "testing"
TEST_TOOLS = ("pytest", "pytest-django")
#: The leg of `make test-matrix` (noxfile.py) this run is: the host's interpreter, and the
#: Django, Celery, kombu and psycopg it already runs (requirement strings), installed before the
#: docs' line as a project made with `django-admin startproject` has its Django already. By default
#: this suite's own Python, and whatever the docs' line alone resolves.
HOST_PYTHON = os.environ.get("HOST_PYTHON") or sys.executable
HOST_STACK = os.environ.get("HOST_STACK", "").split()
#: What the host ended up with, printed at the end of the session (tests/host/conftest.py).
STACK: dict[str, str] = {}
SCHEDULER = "agentflow.beat:Scheduler"
CRASH_AT = "ship:after_effect"
ADMIN = ("admin", secrets.token_urlsafe(16))

#: Phase -> seconds, printed by tests/host/conftest.py at the end of the session.
PHASES: dict[str, float] = {}


def unavailable(reason: str) -> None:
    """Skip where the machine lacks a service; under CI=true that is a failure."""
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


class phase:
    """`with phase("wheel"):` times a phase into PHASES."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.started = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        PHASES[self.name] = PHASES.get(self.name, 0.0) + time.monotonic() - self.started


# --- the server the host's database lives on ---------------------------------------------------
def _server() -> dict[str, Any]:
    """Where this suite's Postgres is (its DATABASE_URL's server), else the machine's."""
    url = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
    db = dj_database_url.parse(url)
    if db.get("ENGINE") != "django.db.backends.postgresql":
        db = dj_database_url.parse("postgres://postgres@127.0.0.1:5432/postgres")
    return {
        "host": db.get("HOST") or "127.0.0.1",
        "port": int(db.get("PORT") or 5432),
        "user": db.get("USER") or "postgres",
        "password": db.get("PASSWORD") or "",
    }


def _admin_connect(server: dict[str, Any], dbname: str = "postgres") -> psycopg.Connection:
    return psycopg.connect(dbname=dbname, autocommit=True, connect_timeout=5, **server)


# --- the Redis database the host's broker is -----------------------------------------------------
def _broker_url() -> str:
    """This suite's database on the machine's Redis (pytest.sh and make test give each worktree
    and each shard one of its own, and the host's tests run in one shard, one after another),
    else database 12."""
    url = os.environ.get("CELERY_BROKER_URL", "")
    if re.fullmatch(r"redis://(127\.0\.0\.1|localhost):6379/\d+", url):
        return url
    return "redis://127.0.0.1:6379/12"


def _text(output: str | bytes | None) -> str:
    """What a timed-out command had printed (bytes, whatever `text=True` asked)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


# --- the host ------------------------------------------------------------------------------------
@dataclass
class Host:
    workdir: Path
    venv: Path
    project: Path
    wheel: Path
    server: dict[str, Any]
    database: str
    broker: str
    env: dict[str, str] = field(default_factory=dict)
    #: Set once the host's test tools are in the venv: from then on it holds more than the
    #: docs' install line.
    test_tools: bool = False

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def run(
        self, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout=180
    ) -> subprocess.CompletedProcess[str]:
        """A command in the venv, in the project; fails the test with its output if it fails
        or does not end within `timeout` seconds."""
        try:
            done = subprocess.run(
                args,
                cwd=cwd or self.project,
                env={**self.env, **(env or {})},
                text=True,
                capture_output=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as late:
            said = _text(late.stdout)[-4000:] + _text(late.stderr)[-4000:]
            raise AssertionError(f"{' '.join(args)} still ran after {timeout} s:\n{said}") from None
        assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n" + (
            done.stdout[-4000:] + done.stderr[-4000:]
        )
        return done

    def manage(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.run(self.python, "manage.py", *args, **kwargs)

    def query(self, sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
        with _admin_connect(self.server, self.database) as conn:
            return conn.execute(sql, params or []).fetchall()


def _clean_env(venv: Path) -> dict[str, str]:
    """What a shell on this machine has, less everything this repository's suite set: the
    host reads its own settings only."""
    keep = ("HOME", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME", "TERM")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
    return env


def _build_wheel(workdir: Path) -> Path:
    """`pip wheel` of a copy of the checkout's package (building in the checkout would leave
    build/ there), with pip's build isolation, as `pip install <checkout>` builds it."""
    source = workdir / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "agentflow",
        source / "agentflow",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
    )
    dist = workdir / "dist"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(source), "-w", str(dist)],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [wheel] = dist.glob("django_agentflow-*.whl")
    return wheel


def _pip(host: Host, *args: str) -> subprocess.CompletedProcess[str]:
    """The venv's own pip, as the host runs it, with the machine's cache and index settings."""
    # Not this suite's PYTHONPATH (make test puts the checkout on it): pip would take the
    # checkout's metadata for an installed agentflow and skip the wheel.
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    return host.run(
        host.python,
        "-m",
        "pip",
        "--disable-pip-version-check",
        *args,
        cwd=host.workdir,
        env=env,
        timeout=600,
    )


#: The versions the host ended up with, read in its venv.
VERSIONS = """
import json, sys
from importlib.metadata import version
names = ("django", "celery", "kombu", "redis", "psycopg")
print(json.dumps({"python": sys.version.split()[0], **{n: version(n) for n in names}}))
"""


def _check_stack(host: Host) -> None:
    """The venv is the leg's Python, and pip kept the stack the host ran before the docs' line."""
    done = host.run(host.python, "-c", VERSIONS, cwd=host.workdir)
    STACK.update(json.loads(done.stdout))
    version = "import sys; print(sys.version.split()[0])"
    asked = host.run(HOST_PYTHON, "-c", version, cwd=host.workdir).stdout
    assert STACK["python"] == asked.strip(), (HOST_PYTHON, STACK)
    for line in HOST_STACK:
        requirement = Requirement(line)
        assert requirement.specifier.contains(STACK[requirement.name]), (line, STACK)


SETTINGS_ADDED = """
# --- agentflow (issue 16's contract: these and "agentflow" in INSTALLED_APPS, nothing else) ---
CELERY_BROKER_URL = {broker!r}
CELERY_BEAT_SCHEDULER = {scheduler!r}
"""

CELERY_PY = """import os

from celery import Celery

# Set the default Django settings module for the 'celery' program.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

app = Celery("shop")

# Using a string here means the worker doesn't have to serialize
# the configuration object to child processes.
# - namespace='CELERY' means all celery-related configuration keys
#   should have a `CELERY_` prefix.
app.config_from_object("django.conf:settings", namespace="CELERY")

# Load task modules from all registered Django apps.
app.autodiscover_tasks()
"""

INIT_PY = """# This will make sure the app is always imported when
# Django starts so that shared_task will use this app.
from .celery import app as celery_app

__all__ = ("celery_app",)
"""


def _make_project(host: Host) -> None:
    """startproject + startapp, then the contract's settings, the Celery guide's app, the
    URLs, and the orders app's models, workflows and tests."""
    host.run(str(host.venv / "bin" / "django-admin"), "startproject", "shop", cwd=host.workdir)
    host.manage("startapp", "orders")
    for name in ("models.py", "workflows.py", "tests.py"):
        shutil.copy2(HERE / "project" / "orders" / name, host.project / "orders" / name)
    shutil.copy2(HERE / "project" / "pytest.ini", host.project / "pytest.ini")
    package = host.project / "shop"
    (package / "celery.py").write_text(CELERY_PY)
    (package / "__init__.py").write_text(INIT_PY)

    settings = (package / "settings.py").read_text()
    settings, apps = re.subn(
        r"(INSTALLED_APPS = \[\n(?:    .*\n)*?)\]",
        r'\1    "agentflow",\n    "orders",\n]',
        settings,
        count=1,
    )
    database = {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": host.database,
        "HOST": host.server["host"],
        "PORT": str(host.server["port"]),
        "USER": host.server["user"],
        "PASSWORD": host.server["password"],
    }
    settings, databases = re.subn(
        r"DATABASES = \{\n(?:.*\n)*?\}\n",
        f"DATABASES = {{\n    'default': {database!r}\n}}\n",
        settings,
        count=1,
    )
    assert apps == databases == 1, "startproject's settings.py changed shape"
    settings += SETTINGS_ADDED.format(broker=host.broker, scheduler=SCHEDULER)
    (package / "settings.py").write_text(settings)

    urls = (package / "urls.py").read_text()
    urls = urls.replace("from django.urls import path", "from django.urls import include, path")
    urls = re.sub(
        r"""(    path\(["']admin/["'], admin\.site\.urls\),\n)""",
        r"""\1    path("agentflow/", include("agentflow.urls")),\n""",
        urls,
    )
    assert 'include("agentflow.urls")' in urls, "startproject's urls.py changed shape"
    (package / "urls.py").write_text(urls)


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Host]:
    server = _server()
    try:
        _admin_connect(server).close()
    except psycopg.OperationalError as exc:
        unavailable(f"tests/host need Postgres at {server['host']}:{server['port']}: {exc}")
    broker = _broker_url()
    try:
        redis.Redis.from_url(broker, socket_timeout=5).ping()
    except redis.RedisError as exc:
        unavailable(f"tests/host need Redis at {broker}: {exc}")

    workdir = tmp_path_factory.mktemp("host")
    database = f"host_shop_{os.getpid()}"
    with _admin_connect(server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{database}"')
    try:
        venv = workdir / "venv"
        with phase("create the venv"):
            subprocess.run([HOST_PYTHON, "-m", "venv", str(venv)], check=True)
        with phase("build the wheel"):
            wheel = _build_wheel(workdir)
        host = Host(
            workdir=workdir,
            venv=venv,
            project=workdir / "shop",
            wheel=wheel,
            server=server,
            database=database,
            broker=broker,
            env=_clean_env(venv),
        )
        if HOST_STACK:
            with phase(f"the host's own stack: pip install {' '.join(HOST_STACK)}"):
                _pip(host, "install", "-q", "--no-compile", *HOST_STACK)
        with phase(f"pip install 'django-agentflow[{EXTRAS}]' (the wheel; the rest: the index)"):
            # The docs' line, with the wheel's path for the name: pip resolves every
            # dependency from the wheel's own metadata and the index (no lock, no pins), and
            # `pip check` proves the set consistent.
            _pip(host, "install", "-q", "--no-compile", f"{wheel}[{EXTRAS}]")
            _pip(host, "check")
        _check_stack(host)
        with phase("startproject and the orders app"):
            _make_project(host)
        yield host
    finally:
        with suppress(psycopg.Error), _admin_connect(server) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            conn.execute(f'DROP DATABASE IF EXISTS "test_{database}" WITH (FORCE)')


@pytest.fixture(scope="module")
def migrated(host: Host) -> Host:
    """`makemigrations orders` and `migrate`, once."""
    with phase("makemigrations and migrate"):
        made = host.manage("makemigrations", "orders")
        assert (host.project / "orders" / "migrations" / "0001_initial.py").exists(), made.stdout
        applied = host.manage("migrate", "--noinput").stdout
    assert "Applying agentflow.0001_initial... OK" in applied, applied
    assert "Applying orders.0001_initial... OK" in applied, applied
    return host


# --- 1. the wheel ------------------------------------------------------------------------------
def test_wheel__ships_the_engine_alone_with_its_admin_templates(host: Host) -> None:
    names = zipfile.ZipFile(host.wheel).namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"agentflow"}
    templates = [n for n in names if n.startswith("agentflow/templates/admin/agentflow/")]
    for needed in (
        "workflowrun/change_form.html",
        "workflowrun/action_confirmation.html",
        "workflowrun/fork_confirmation.html",
        "workflowrun/change_list.html",
    ):
        assert f"agentflow/templates/admin/agentflow/{needed}" in templates, templates
    site = [n for n in names if n.rsplit("/", 1)[-1] in ("settings.py", "wsgi.py", "asgi.py")]
    assert not site, f"site modules in the wheel: {site}"
    assert not [n for n in names if n.startswith(("refunds/", "config/", "tests/"))]
    # The repository's tooling stays in config/: the bench and its synthetic rows.
    assert not [n for n in names if "bench" in n or "synthetic" in n]


def test_wheel__metadata_is_what_a_package_index_shows(host: Host) -> None:
    """The project's page on an index: the README, the licence, the supported Pythons and
    Djangos; and only the extras an adopter may install (the repository's own needs are
    dependency groups, which no wheel carries)."""
    wheel = zipfile.ZipFile(host.wheel)
    [metadata_name] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    metadata = email.parser.Parser().parsestr(wheel.read(metadata_name).decode())
    assert metadata["Name"] == "django-agentflow"
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert metadata.get_payload().strip() == (ROOT / "README.md").read_text().strip()
    assert metadata["License-Expression"] == "Apache-2.0"
    assert metadata_name.replace("METADATA", "licenses/LICENSE") in wheel.namelist()
    assert metadata["Requires-Python"] == ">=3.11"
    classifiers = metadata.get_all("Classifier")
    for minor in ("3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {minor}" in classifiers
    for minor in ("5.2", "6.0", "6.1"):
        assert f"Framework :: Django :: {minor}" in classifiers
    assert "Framework :: Celery" in classifiers
    assert set(metadata.get_all("Provides-Extra")) == {
        "agent",
        "mcp",
        "prometheus",
        "otel",
        "redis",
        "tasks",
        "testing",
    }
    requires = " ".join(metadata.get_all("Requires-Dist"))
    for ours in ("stripe", "gunicorn", "dbos", "pytest", "kombu"):
        assert ours not in requires, requires


# --- 3. the settings the contract names are enough ---------------------------------------------
def test_manage_py_check__passes_with_the_contracts_settings_alone(host: Host) -> None:
    with phase("manage.py check"):
        done = host.manage("check")
    assert "System check identified no issues" in done.stdout, done.stdout + done.stderr
    settings = (host.project / "shop" / "settings.py").read_text()
    assert "AGENTFLOW_" not in settings


# --- 4 and 5. a crash under the host's worker and beat; the admin ------------------------------
class Process:
    """One of the host's Celery processes, in a process group of its own, logging to a file."""

    def __init__(self, host: Host, name: str, args: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.log = host.workdir / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                args,
                cwd=host.project,
                env={**host.env, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_for_log(self, needle: str, timeout: float = 60) -> None:
        def seen() -> bool:
            assert self.alive(), f"{self.name} exited:\n{self.text()[-4000:]}"
            return needle in self.text()

        wait_for(seen, timeout=timeout, interval=0.05, what=f"{self.name} to log {needle!r}")

    def stop(self) -> None:
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)


def test_run__survives_a_worker_killed_after_its_effect__and_the_admin_shows_it(
    migrated: Host,
) -> None:
    host = migrated
    # The venv holds the docs' install line and nothing else (the tests after this one add
    # the host's test tools, which would bring what a host without [redis] lacks).
    assert not host.test_tools, "this test must run before the test tools are installed"
    celery = str(host.venv / "bin" / "celery")
    host.manage(
        "createsuperuser",
        "--noinput",
        "--username",
        ADMIN[0],
        "--email",
        "ops@example.com",
        env={"DJANGO_SUPERUSER_PASSWORD": ADMIN[1]},
    )
    started: list[Process] = []
    try:
        with phase("start worker and beat"):
            worker = Process(
                host,
                "worker",
                [
                    celery,
                    "-A",
                    "shop",
                    "worker",
                    "-l",
                    "info",
                    "-c",
                    "1",
                    "-n",
                    f"shop{os.getpid()}@%h",
                    "--without-mingle",
                    "--without-gossip",
                ],
                {"AGENTFLOW_FAULTS": "1", "AGENTFLOW_CRASH_AT": CRASH_AT},
            )
            started.append(worker)
            beat = Process(
                host,
                "beat",
                [
                    celery,
                    "-A",
                    "shop",
                    "beat",
                    "-l",
                    "info",
                    "-s",
                    str(host.workdir / "celerybeat-schedule"),
                ],
                {},
            )
            started.append(beat)
            worker.wait_for_log(" ready.")
            # kombu 5.7 masks the (empty) password ("Connected to redis://:**@127.0.0.1:6379/3"),
            # 5.5 and 5.6 print none.
            address = re.escape(host.broker.removeprefix("redis://"))
            connected = rf"Connected to redis://(:\*\*@)?{address}$"
            assert re.search(connected, worker.text(), re.M), worker.text()[-4000:]
            beat.wait_for_log("beat: Starting...")

        with phase("start a run; the worker crashes after the effect; the run completes"):
            run_id = (
                host.manage(
                    "shell",
                    "-c",
                    "from agentflow import durable; print(durable.start('fulfil_order', "
                    "input={'order': 42}, business_key='order-42'))",
                )
                .stdout.strip()
                .splitlines()[-1]
            )

            def finished() -> str | None:
                assert worker.alive(), worker.text()[-4000:]
                assert beat.alive(), beat.text()[-4000:]
                [(status,)] = host.query(
                    "SELECT status FROM agentflow_workflowrun WHERE id = %s", [run_id]
                )
                return None if status in ("PENDING", "RUNNING", "WAITING") else status

            status = wait_for(finished, timeout=90, interval=0.1, what=f"run {run_id} to end")
        log = worker.text()
        assert status == "COMPLETED", log[-4000:]
        assert f"fault injection: SIGKILL at {CRASH_AT}" in log, log[-4000:]
        key = f"{run_id}_step_2"
        # The partner's own rows: asked twice (before and after the kill), shipped once.
        assert host.query("SELECT count(*) FROM orders_partnercall WHERE key = %s", [key]) == [(2,)]
        assert host.query("SELECT count(*) FROM orders_shipment WHERE key = %s", [key]) == [(1,)]
        assert host.query(
            "SELECT name, status FROM agentflow_stepcheckpoint WHERE run_id = %s ORDER BY seq",
            [run_id],
        ) == [("reserve", "COMPLETED"), ("ship", "COMPLETED"), ("confirm", "COMPLETED")]

        with phase("admin pages and healthz"):
            done = host.run(host.python, str(HERE / "scripts" / "admin_pages.py"), run_id, *ADMIN)
        pages = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        for process in started:
            process.stop()

    print(json.dumps(pages, indent=1))
    metrics = pages.pop("GET /agentflow/metrics")  # prometheus-client is an extra, not installed
    assert metrics["status"] == 501 and "django-agentflow[prometheus]" in metrics["body"], metrics
    change = next(
        url for url in pages if re.fullmatch(r"GET /admin/agentflow/workflowrun/[^/]+/change/", url)
    )
    assert pages[change]["status"] == 200 and pages[change]["timeline"], pages[change]
    broken = {
        url: page for url, page in pages.items() if page["status"] >= 400 or page["final"] != 200
    }
    assert not broken, json.dumps(pages, indent=2)
    actions = [url for url in pages if re.search(r"/(retry|resume|cancel)/$|action=", url)]
    assert len(actions) >= 6, pages  # three buttons, three list actions
    assert all(pages[url]["status"] == 200 for url in actions), json.dumps(pages, indent=2)
    health = pages["GET /agentflow/healthz"]
    assert health["status"] == 200 and health["body"]["status"] == "ok", health


# --- 8. Django's own @task, durable: agentflow as the tasks backend (issue 38) -------------------
TASKS_SETTING = """
# --- agentflow as Django's tasks backend (docs/tasks-backend.md) ---
TASKS = {"default": {"BACKEND": "agentflow.tasks_backend.DurableTaskBackend"}}
"""
TASK_CRASH_AT = "task:after_effect"


def test_django_tasks__transactional_durable_and_readable_from_another_process(
    migrated: Host,
) -> None:
    """With the README's settings and TASKS naming the backend (on Django 5.2 the backport
    too, as docs/tasks-backend.md says): a rolled-back enqueue never
    runs; a committed one runs exactly once though its worker is SIGKILLed mid-task (the
    partner asked twice under one key, the shipment made once); `get_result` from yet another
    process says RUNNING while it runs and SUCCESSFUL with its value after; an unknown id
    raises TaskResultDoesNotExist."""
    host = migrated
    settings = host.project / "shop" / "settings.py"
    text = settings.read_text() + TASKS_SETTING
    if int(STACK["django"].split(".")[0]) < 6:
        # Django 5.2: the framework is the backport, as docs/tasks-backend.md says to add it.
        with phase("tasks: pip install 'django-agentflow[tasks]' (the backport)"):
            _pip(host, "install", "-q", "--no-compile", f"{host.wheel}[{EXTRAS},tasks]")
            _pip(host, "check")
        text += 'INSTALLED_APPS += ["django_tasks"]\n'
    settings.write_text(text)
    shutil.copy2(HERE / "project" / "tasks.py", host.project / "orders" / "tasks.py")
    checked = host.manage("check")
    assert "System check identified no issues" in checked.stdout, checked.stdout + checked.stderr

    def calls(*args: str) -> dict[str, Any]:
        done = host.run(host.python, str(HERE / "scripts" / "task_calls.py"), *args, timeout=150)
        return json.loads(done.stdout.strip().splitlines()[-1])

    celery = str(host.venv / "bin" / "celery")
    started: list[Process] = []
    try:
        with phase("tasks: start worker and beat"):
            worker = Process(
                host,
                "tasks-worker",
                [
                    celery,
                    "-A",
                    "shop",
                    "worker",
                    "-l",
                    "info",
                    "-c",
                    "1",
                    "-n",
                    f"tasks{os.getpid()}@%h",
                    "--without-mingle",
                    "--without-gossip",
                ],
                {"AGENTFLOW_FAULTS": "1", "AGENTFLOW_CRASH_AT": TASK_CRASH_AT},
            )
            started.append(worker)
            beat = Process(
                host,
                "tasks-beat",
                [
                    celery,
                    "-A",
                    "shop",
                    "beat",
                    "-l",
                    "info",
                    "-s",
                    str(host.workdir / "tasks-celerybeat-schedule"),
                ],
                {},
            )
            started.append(beat)
            worker.wait_for_log(" ready.")
            beat.wait_for_log("beat: Starting...")

        with phase("tasks: rollback, enqueue, RUNNING, SIGKILL mid-task, SUCCESSFUL"):
            rolled_back = calls("rollback", "1")["id"]
            enqueued = calls("enqueue", "2", "hold")
            result_id = enqueued["id"]
            running = calls("wait", result_id, "RUNNING")
            assert running["status"] == "RUNNING", (running, worker.text()[-4000:])
            assert running["started_at"] and running["last_attempted_at"], running
            assert running["finished_at"] is None and len(running["worker_ids"]) == 1, running
            assert running["pid"] not in (enqueued["pid"], worker.proc.pid)
            with _admin_connect(host.server, host.database) as conn:
                conn.execute("INSERT INTO orders_release (result_id) VALUES (%s)", [result_id])
            done = calls("wait", result_id, "SUCCESSFUL")
        log = worker.text()
        assert done["status"] == "SUCCESSFUL", (done, log[-4000:])
        assert f"fault injection: SIGKILL at {TASK_CRASH_AT}" in log, log[-4000:]
        key = done["return_value"]["key"]
        assert key == f"{result_id}_step_1" and done["attempts"] == 2, done
        # The partner's own rows: asked twice under one key (before and after the kill),
        # shipped once.
        assert host.query("SELECT count(*) FROM orders_partnercall WHERE key = %s", [key]) == [(2,)]
        assert host.query("SELECT count(*) FROM orders_shipment WHERE key = %s", [key]) == [(1,)]

        # The rolled-back enqueue: no run, nothing at the partner, unknown to get_result.
        assert calls("get", rolled_back) == {"error": "TaskResultDoesNotExist"}
        assert host.query(
            "SELECT count(*) FROM agentflow_workflowrun WHERE id = %s", [rolled_back]
        ) == [(0,)]
        assert host.query(
            "SELECT count(*) FROM orders_partnercall WHERE key LIKE %s", [f"{rolled_back}_%"]
        ) == [(0,)]
        assert calls("get", "no-such-result") == {"error": "TaskResultDoesNotExist"}
    finally:
        for process in started:
            process.stop()


# --- the host's test tools, once the docs' line alone has run a workflow -------------------------
@pytest.fixture(scope="module")
def tooled(migrated: Host) -> Host:
    """What agentflow.testing needs, into the same venv, once: `pip install
    'django-agentflow[testing]' pytest pytest-django`, from the index as well."""
    host = migrated
    with phase("pip install the host's test tools"):
        _pip(
            host, "install", "-q", "--no-compile", f"{host.wheel}[{TEST_TOOLS_EXTRAS}]", *TEST_TOOLS
        )
        _pip(host, "check")
    host.test_tools = True
    return host


# --- 2. import agentflow (after the run: agentflow.testing's plugin imports pytest) -------------
def test_import_agentflow__has_no_side_effects(tooled: Host, tmp_path: Path) -> None:
    host = tooled
    empty, temporary = tmp_path / "empty", tmp_path / "tmp"
    empty.mkdir()
    temporary.mkdir()
    with phase("import probe"):
        done = host.run(
            host.python,
            str(HERE / "scripts" / "import_probe.py"),
            "agentflow",
            "agentflow.testing",
            "agentflow.testing.pytest_plugin",
            # A temporary directory of its own: other tests' servers come and go in /tmp.
            cwd=empty,
            env={"PYTHONDONTWRITEBYTECODE": "1", "TMPDIR": str(temporary)},
        )
    report = json.loads(done.stdout)
    assert report["changed"] == {}, json.dumps(report, indent=2)


# --- 7. the host's own tests, with agentflow.testing ----------------------------------------------
def test_hosts_own_suite__uses_agentflow_testing_in_process_and_with_a_real_worker(
    tooled: Host,
) -> None:
    with phase("the host's own pytest (agentflow.testing)"):
        done = host_pytest = tooled.run(
            # A test stuck for two minutes prints every thread's stack (pytest's faulthandler).
            str(tooled.venv / "bin" / "pytest"),
            "-q",
            "-o",
            "faulthandler_timeout=120",
            "orders/tests.py",
            timeout=300,
        )
    assert re.search(r"^2 passed", host_pytest.stdout, re.M), done.stdout
