"""A standby promoted under live claims (issue 19, finding 8a): on private PostgreSQL servers, a
primary and its streaming standby, never the machine's shared one.

The standby holds none of the primary's advisory locks, and it was started before the claims it
replicated, so "claimed since this server started, and its owner's lock is free" used to read
"owner gone" for every live owner. A claim records the server its lock is held on; a promoted
standby is another server (a new timeline), where the lease decides.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest
from django.core.management import call_command
from django.db import transaction

from agentflow import _store as store
from agentflow import durable
from agentflow._core import leases
from agentflow._engine import runtime
from agentflow.testing.processes import PostgresServer, ProcessStartError, _pg_binary
from agentflow.testing.waiting import wait_for
from tests.support import workflows

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]


class Standby(PostgresServer):
    """A physical standby of `primary`, streaming from it (`pg_basebackup -R`)."""

    def __init__(self, primary: PostgresServer, workdir: Path) -> None:
        super().__init__(workdir, dbname=primary.dbname)
        self.primary = primary

    def start(self, *, timeout: float = 60.0) -> Self:
        if self.base is None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            self.base = Path(tempfile.mkdtemp(prefix="agentflow-standby-"))
            self._run_as_owner(
                [
                    _pg_binary("pg_basebackup"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(self.primary.port),
                    "-U",
                    "postgres",
                    "-D",
                    str(self.base / "data"),
                    "-R",
                    "-X",
                    "stream",
                    "--checkpoint=fast",
                ],
                wait=True,
            )
        return super().start(timeout=timeout)  # a base already there: no initdb, no database

    def caught_up(self) -> bool:
        with self.primary.connect() as primary, self.connect() as standby:
            wanted = primary.execute("SELECT pg_current_wal_lsn()::text").fetchone()
            (replayed,) = standby.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [wanted[0] if wanted else None]
            ).fetchone() or (False,)
        return bool(replayed)

    def promote(self) -> None:
        with self.connect() as conn:
            conn.execute("SELECT pg_promote(wait => true)")


@pytest.fixture
def primary(tmp_path: Path) -> Iterator[PostgresServer]:
    server = PostgresServer(tmp_path / "primary", dbname="promoted")
    try:
        server.start()
    except ProcessStartError as exc:
        server.stop()
        pytest.skip(f"no private PostgreSQL here: {exc}")
    yield server
    leases.release()  # this process's liveness connection went to it
    server.stop()


def test_promotion__a_live_owner_on_the_old_primary__left_to_its_lease_not_taken_over(
    primary: PostgresServer, tmp_path: Path, settings: Any
) -> None:
    settings.AGENTFLOW_LEASE_SECONDS = 120  # outlasts the replay and the promotion
    with primary.serving_django():
        call_command("migrate", verbosity=0, interactive=False)
        standby = Standby(primary, tmp_path / "standby").start()  # long before the claim
        try:
            run_id = durable.start(workflows.chain.name)
            runtime.run_step(run_id, 1)  # prepare
            state = store.state_load(run_id, 2)
            assert state is not None
            claim = store.step_claim(state, workflows.chain.steps["charge"], 2, None)
            assert claim is not None  # held by this process's lock, on the primary
            seen = store.state_load(run_id, 2)
            assert seen is not None and seen.checkpoint is not None
            assert seen.checkpoint.lease_owner == leases.current_owner()[0]
            assert not seen.checkpoint.claimable  # the owner is alive
            wait_for(standby.caught_up, what="the standby to replay the claim")
            standby.promote()

            with standby.serving_django():
                found = store.state_load(run_id, 2)
                with transaction.atomic():
                    swept = [due.id for due in store.sweep_due(10)]

            assert found is not None and found.checkpoint is not None
            assert not found.checkpoint.lease_expired
            assert not found.checkpoint.claimable  # the lease decides, not a free lock
            assert run_id not in swept
        finally:
            standby.stop()
