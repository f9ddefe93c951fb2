"""A database that does not answer, for tests of what each process does meanwhile.

- `database_down()`: this process's default database points at a port where nothing listens
  (connections are refused, as when Postgres is stopped) until the block ends; then every
  connection opens on the real one again. The machine's Postgres is never touched.
- autouse: each test starts with a process that has seen no outage (`agentflow._core.outage` keeps
  one account per process, which would otherwise carry over from an earlier test).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from django.db import connection, connections

from agentflow._core import outage
from agentflow.testing.processes import free_port


@pytest.fixture(autouse=True)
def _no_outage_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outage, "_account", outage._Account())


@contextlib.contextmanager
def database_down() -> Iterator[None]:
    """Until the block ends, every new connection of this process is refused (the settings
    dict is shared by the alias's connection objects, as in `PostgresServer.serving_django`)."""
    db = connection.settings_dict
    saved = {key: db[key] for key in ("HOST", "PORT")}
    connections.close_all()
    db.update(HOST="127.0.0.1", PORT=str(free_port()))
    try:
        yield
    finally:
        connections.close_all()
        db.update(saved)
