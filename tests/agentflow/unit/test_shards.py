"""What each shard of `make test` gets of its own, and which tests run as one unit."""

from __future__ import annotations

import os

import pytest

from tests.support import shards


def test_isolate__var_dir_redis_database_and_ports_are_the_shards_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGENTFLOW_VAR_DIR", "/x/var/test")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/x/var/test/metrics")
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:6379/15")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/15")
    monkeypatch.setenv("AGENTFLOW_TEST_PORTS", "")  # restored after, as the others are
    shards._isolate(2, 3)
    env = os.environ
    assert env["AGENTFLOW_VAR_DIR"] == "/x/var/test/shard2"
    assert "PROMETHEUS_MULTIPROC_DIR" not in env
    assert env["CELERY_BROKER_URL"] == env["REDIS_URL"] == "redis://127.0.0.1:6379/13"
    low, high = map(int, env["AGENTFLOW_TEST_PORTS"].split("-"))
    assert (low, high) == (24_666, 31_998)  # a third of 10,000-32,000 each


def test_group__shared_servers_run_as_one_unit__other_tests_alone() -> None:
    assert shards.group("tests/host/test_host_project.py::test_a") == shards.HOST
    assert shards.group("tests/x.py::test_send[rabbitmq]") == shards.RABBITMQ
    assert shards.group("tests/x.py::test_rabbitmq_killed") == shards.RABBITMQ
    assert shards.group("tests/x.py::test_send[redis]") == "tests/x.py::test_send[redis]"
