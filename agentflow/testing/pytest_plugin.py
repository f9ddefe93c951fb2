"""agentflow's pytest plugin: fixtures for a Django project's tests of its workflows.

Loaded automatically once agentflow is installed (the `pytest11` entry point); with
`-p no:agentflow` it is not, and `pytest_plugins = ["agentflow.testing.pytest_plugin"]` in a
conftest.py loads it by hand. Needs pytest-django for the database.

Fixtures:

- `agentflow_outbox`: for the test's length, step messages are kept (an `Outbox`) instead of
  published, so nothing needs a broker; drive runs with `agentflow.testing.run_to_end`.
- `agentflow_worker`: `agentflow_worker(env=..., concurrency=1, beat=False, settings=...)`
  starts a real `celery -A <app> worker` process on the test database and returns it (an
  `agentflow.testing.processes.WorkerProcess`: `alive()`, `kill()`, `kill_child()`,
  `log_tail()`); every worker it started is SIGKILLed when the test ends. The test is a
  `transaction=True` one, so the worker sees what it commits.

<app> is the ini option `agentflow_celery_app` (`-A` as Celery takes it: "shop",
"config.celery_app"), else the Celery app that is current once Django is set up (its main
name, as in `Celery("shop")`). The worker runs the project's own settings with only its
databases renamed to the test ones (as pytest-django does in this process) plus `settings`.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from agentflow.testing.inprocess import Outbox
    from agentflow.testing.processes import WorkerProcess

APP_OPTION = "agentflow_celery_app"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        APP_OPTION,
        "the Celery app agentflow_worker starts, as `celery -A` takes it (default: the "
        "current Celery app's main name)",
        default="",
    )


@pytest.fixture(autouse=True)
def _agentflow_liveness_released() -> Iterator[None]:
    """A step claimed in this process opened a liveness connection to the test database; it
    is closed after the test, so that the database can be dropped at the end."""
    yield
    leases = sys.modules.get("agentflow._core.leases")
    if leases is not None:
        leases.release()


@pytest.fixture
def agentflow_outbox() -> Iterator[Outbox]:
    from agentflow.testing.inprocess import capture_messages

    with capture_messages() as outbox:
        yield outbox


def celery_app_name(config: pytest.Config) -> str:
    configured = str(config.getini(APP_OPTION) or "")
    if configured:
        return configured
    from celery import current_app

    main = current_app.main
    if not main or main == "__main__":
        raise pytest.UsageError(
            f"agentflow_worker: no Celery app is current; set `{APP_OPTION}` in the pytest "
            "configuration (the -A of your `celery -A ... worker`)"
        )
    return str(main)


def _project_paths() -> list[str]:
    """This process's import path less the interpreter's own: the project's directories (as
    pytest's rootdir and `pythonpath` put them there), for the worker to import from."""
    own = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return [
        path
        for path in sys.path
        if path and not any(os.path.realpath(path).startswith(prefix) for prefix in own)
    ]


def worker_settings_module(directory: Path, overrides: Mapping[str, Any] | None = None) -> str:
    """Write a settings module that is the project's own with the test databases' names (and
    `overrides`, each a literal) in `directory`; return its name."""
    from django.conf import settings
    from django.db import connections

    lines = [
        '"""The project\'s settings on the test databases (written by agentflow.testing)."""',
        "import copy",
        f"from {settings.SETTINGS_MODULE} import *  # noqa: F403",
        "DATABASES = copy.deepcopy(DATABASES)  # noqa: F405",
    ]
    for alias in settings.DATABASES:
        db = connections[alias].settings_dict
        if db["ENGINE"] != "django.db.backends.postgresql":
            pytest.skip(f"agentflow_worker needs Postgres, not {db['ENGINE']} ({alias!r})")
        lines.append(f"DATABASES[{alias!r}]['NAME'] = {db['NAME']!r}")
    for key, value in (overrides or {}).items():
        if not key.isupper() or not key.isidentifier():
            raise ValueError(f"{key!r} is not a settings name")
        lines.append(f"{key} = {value!r}")
    name = f"agentflow_test_settings_{secrets.token_hex(4)}"
    (directory / f"{name}.py").write_text("\n".join(lines) + "\n")
    return name


@pytest.fixture
def agentflow_worker(
    request: pytest.FixtureRequest, transactional_db: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., WorkerProcess]]:
    from django.conf import settings as django_settings

    from agentflow.testing.processes import WorkerProcess

    app = celery_app_name(request.config)
    started: list[WorkerProcess] = []
    workdir = tmp_path_factory.mktemp("agentflow-workers")

    def start(
        *,
        env: Mapping[str, str] | None = None,
        concurrency: int = 1,
        beat: bool = False,
        settings: Mapping[str, Any] | None = None,
        timeout: float = 60.0,
    ) -> WorkerProcess:
        module = worker_settings_module(workdir, settings)
        paths = [str(workdir), *_project_paths(), os.environ.get("PYTHONPATH", "")]
        full_env = {
            "AGENTFLOW_FAULTS": "0",
            "AGENTFLOW_CRASH_AT": "",
            **(env or {}),
            # Celery reads CELERY_BROKER_URL from the environment before the settings.
            **(
                {"CELERY_BROKER_URL": str(settings["CELERY_BROKER_URL"])}
                if settings and "CELERY_BROKER_URL" in settings
                else {}
            ),
            "DJANGO_SETTINGS_MODULE": module,
            "PYTHONPATH": os.pathsep.join(path for path in paths if path),
        }
        worker = WorkerProcess(
            app=app,
            cwd=Path(getattr(django_settings, "BASE_DIR", request.config.rootpath)),
            env=full_env,
            name=f"worker{len(started) + 1}-{os.getpid()}",
            log_dir=workdir,
            concurrency=concurrency,
            beat=beat,
        )
        started.append(worker)
        return worker.start(timeout=timeout)

    yield start
    for worker in started:
        worker.kill()
