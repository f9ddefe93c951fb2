"""The suite in shards (`make test`, TEST_SHARDS; pytest-xdist): each shard its own services.

Loaded with `-p tests.support.shards` before pytest-django sets Django up, since the settings
read their directories and URLs once, at import. In shard N (xdist's worker `gwN`), before
that import:
- `AGENTFLOW_VAR_DIR` gains `/shardN`: logs, metric files, sandbox state and the beat schedule
  are each shard's own (the metric files of one shard's killed workers are not another's);
- the machine Redis URLs (`CELERY_BROKER_URL`, `REDIS_URL`) move to database number `db - N`;
- `AGENTFLOW_TEST_PORTS` gives it a slice of the ports `free_port` hands out.
pytest-django already gives each shard its own test database (`test_<name>_gwN`), and each
shard's session starts its own private Redis. Tests of one shared server that a test empties
(the machine's RabbitMQ) all run in one shard, one after another, and so do the host
project's, which share the venv they build (`pytest_xdist_make_scheduler`).
Without xdist this plugin only names the suite's build: every process a test starts (workers,
web, beat) runs the code of this checkout, so they are one build (`AGENTFLOW_BUILD_ID`,
docs/deploys.md, "Builds"), whatever test modules the test process also registered; the tests of
deploys give the processes of their second tree a build of its own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator
from typing import Any

import pytest

#: The build of the suite's own processes (see the module).
SUITE_BUILD = "suite"
#: The ports `free_port` chooses from (below Linux's ephemeral range), split among shards.
PORTS = (10_000, 32_000)
#: Tests that empty or restart one server the machine has once: they share a shard.
RABBITMQ = "rabbitmq"
#: The host project's tests share one built venv (a module fixture): one shard builds it once.
HOST = "tests/host/"


def shard() -> int | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if re.fullmatch(r"gw\d+", worker) else None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Generator[None, None, None]:
    os.environ.setdefault("AGENTFLOW_BUILD_ID", SUITE_BUILD)
    number = shard()
    if number is not None:
        _isolate(number, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    return (yield)


def _isolate(number: int, count: int) -> None:
    var = os.environ.get("AGENTFLOW_VAR_DIR")
    if var:
        os.environ["AGENTFLOW_VAR_DIR"] = os.path.join(var, f"shard{number}")
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the settings derive it from the above
    for key in ("CELERY_BROKER_URL", "REDIS_URL"):
        url = os.environ.get(key, "")
        found = re.fullmatch(r"(redis://[^/]+/)(\d+)", url)
        if found:
            os.environ[key] = f"{found[1]}{max(0, int(found[2]) - number)}"
    low, high = PORTS
    width = (high - low) // max(count, 1)
    os.environ["AGENTFLOW_TEST_PORTS"] = f"{low + number * width}-{low + (number + 1) * width - 1}"


def group(nodeid: str) -> str:
    """The unit a shard runs whole: a test alone, or every test of one shared server."""
    if nodeid.startswith(HOST):
        return HOST
    if RABBITMQ in nodeid.lower():
        return RABBITMQ
    return nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's own grouping (`--dist loadgroup`) silently stops grouping on pytest 9.2
    (pytest-dev/pytest-xdist#1386): the groups are chosen here from the node ids instead."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedServers(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group(nodeid)

    return SharedServers(config, log)
