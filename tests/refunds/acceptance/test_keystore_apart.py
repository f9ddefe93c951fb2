"""Subject keys kept apart from the data they seal (issue 42, docs/privacy.md "Backups and
restores"): a `pg_dump` of the data taken before a customer's erasure, restored into a fresh
database beside the current keystore, shows that customer erased, the other intact and every run
with the money it moved; a keystore restored from before the erasure shows them again until
`agentflow_erase --replay`.

Real processes against fresh Postgres databases of their own (data, keystore, and the restores):
`manage.py migrate` on both, refunds made by the refund service's own entry point in a
`manage.py shell`, a real worker with beat against the sandbox, `pg_dump` and `psql` to back up
and restore, `manage.py agentflow_erase`, and reads (the admin, status.json, the models) by a
process pointed at each pair of databases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from agentflow._privacy.envelope import ERASED
from agentflow._privacy.keys import new_master_key
from agentflow.testing.processes import WorkerProcess
from refunds.privacy import FIELDS
from refunds.sandbox.airline import booking, owner_of
from tests.support.refunds import refund_worker_env
from tests.support.sandbox import SandboxProcess

ROOT = Path(__file__).resolve().parents[3]
GONE, KEPT = "KSA001", "KSB001"  # the customer erased, the one kept
MASTER = new_master_key("mk1")

#: Made in a `manage.py shell` on the site's settings: the two customers' refunds, through the
#: service the form calls (the request row and its run in one transaction).
SUBMIT = f"""
import json
from tests.support.refunds import submit
print(json.dumps([submit(r) for r in {[GONE, KEPT]!r}]))
"""
#: What a reader sees, from a process pointed at one pair of databases: each request's sealed
#: columns, its run (status, every step's output), its admin pages and its status.json.
READ = """
import json
from django.contrib.auth.models import User
from django.test import Client
from django.contrib.admin.utils import quote
from agentflow import durable
from refunds.models import RefundRequest
admin = User.objects.filter(username="auditor").first() or User.objects.create_superuser(
    "auditor", "auditor@example.test", "x")
staff = Client()
staff.force_login(admin)
seen = {}
for r in RefundRequest.objects.order_by("booking_reference"):
    run = durable.snapshot(r.workflow_id)
    seen[r.booking_reference] = {
        "request": [r.email, r.last_name, r.message],
        "status": str(run.status),
        "steps": {s.name: s.output for s in run.steps},
        "pages": staff.get(f"/admin/refunds/refundrequest/{r.pk}/change/").content.decode()
        + staff.get(
            f"/admin/agentflow/workflowrun/{quote(r.workflow_id)}/change/"
        ).content.decode(),
        "status_json": Client().get(f"/refunds/{r.public_id}/status.json").content.decode(),
    }
print(json.dumps(seen))
"""


class Server:
    """The machine's Postgres, where this test makes databases of its own (dropped after)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.made: list[str] = []

    def url_of(self, name: str) -> str:
        return urlunsplit(urlsplit(self.url)._replace(path=f"/{name}"))

    def _admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.url_of("postgres"), autocommit=True)

    def create(self, role: str) -> str:
        name = f"ks_{uuid.uuid4().hex[:10]}_{role}"
        with self._admin() as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        self.made.append(name)
        return name

    def drop_all(self) -> None:
        with self._admin() as conn:
            for name in self.made:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def tables(self, name: str) -> set[str]:
        with psycopg.connect(self.url_of(name)) as conn:
            found = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            return {row[0] for row in found}

    def statuses(self, name: str, run_ids: list[str]) -> list[str]:
        with psycopg.connect(self.url_of(name)) as conn:
            found: dict[str, str] = dict(
                conn.execute(
                    "SELECT id, status FROM agentflow_workflowrun WHERE id = ANY(%s)", [run_ids]
                ).fetchall()
            )
        return [found.get(run_id, "") for run_id in run_ids]

    def dump(self, name: str, to: Path) -> str:
        """`pg_dump` of database `name` into file `to` (plain SQL); its text."""
        self._tool("pg_dump", "--no-owner", "-f", str(to), name)
        return to.read_text()

    def restore(self, dump: Path, name: str) -> None:
        self._tool("psql", "-v", "ON_ERROR_STOP=1", "-q", "-f", str(dump), name)

    def _tool(self, tool: str, *args: str) -> None:
        where = urlsplit(self.url)
        command = [tool, "-h", where.hostname or "127.0.0.1", "-U", where.username or "postgres"]
        command += ["-p", str(where.port or 5432), *args]
        env = {"PATH": "/usr/bin:/bin:/usr/local/bin", "PGPASSWORD": where.password or ""}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture
def server(clean_sandbox: SandboxProcess) -> Iterator[Server]:
    found = Server(refund_worker_env(clean_sandbox)["DATABASE_URL"])
    try:
        yield found
    finally:
        found.drop_all()


class Site:
    """The site as its processes run it, on data database `data` with keystore `keys`."""

    def __init__(self, server: Server, sandbox: SandboxProcess, data: str, keys: str) -> None:
        self.env = {
            **os.environ,
            **refund_worker_env(
                sandbox,
                DATABASE_URL=server.url_of(data),
                KEYSTORE_DATABASE_URL=server.url_of(keys),
                AGENTFLOW_MASTER_KEYS=MASTER,
                DJANGO_ALLOWED_HOSTS="testserver",
            ),
        }

    def manage(self, *args: str) -> str:
        """`manage.py ...`'s output, once it succeeded."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
        return done.stdout

    def shell(self, script: str) -> Any:
        """What `script`, run in `manage.py shell`, printed last, as JSON."""
        return json.loads(self.manage("shell", "-c", script).strip().splitlines()[-1])


def personal_words(reference: str) -> list[str]:
    """What of the customer no reader may see once they are erased."""
    owner, found = owner_of(reference), booking(reference, today=date.min)
    first, last = found["passenger"]["first_name"], found["passenger"]["last_name"]
    return [owner.email, f"{first} {last}", owner.last_name]


def erased_where_personal(value: Any) -> Any:
    """`value` as it must read once its subject is erased: every personal field "erased"."""
    if isinstance(value, list):
        return [erased_where_personal(item) for item in value]
    if not isinstance(value, dict):
        return value
    return {
        key: ERASED if key in FIELDS and item is not None else erased_where_personal(item)
        for key, item in value.items()
    }


def test_erasure__a_restored_backup_of_the_data_stays_erased__a_restored_keystore_replays(
    server: Server, clean_sandbox: SandboxProcess, tmp_path: Path
) -> None:
    data, keys = server.create("data"), server.create("keys")
    live = Site(server, clean_sandbox, data, keys)
    live.manage("migrate", "--noinput")
    live.manage("migrate", "--database", "keystore", "--noinput")
    # The keystore holds the key table alone; the data, everything but it.
    assert server.tables(keys) == {"agentflow_subjectkey", "django_migrations"}
    data_tables = server.tables(data)
    assert "agentflow_subjectkey" not in data_tables
    assert {"agentflow_workflowrun", "agentflow_erasurejournal", "refunds_refundrequest"} <= (
        data_tables
    )

    worker = WorkerProcess(concurrency=2, env=live.env, beat=True)
    worker.start(timeout=90)
    try:
        runs = live.shell(SUBMIT)
        deadline = time.monotonic() + 150
        while server.statuses(data, runs) != ["COMPLETED"] * 2:
            assert worker.alive(), worker.log_tail()
            assert time.monotonic() < deadline, (server.statuses(data, runs), worker.log_tail())
            time.sleep(0.5)
    finally:
        worker.kill()

    before = live.shell(READ)
    assert before[GONE]["request"][0] == owner_of(GONE).email  # readable while they are kept
    data_dump = server.dump(data, tmp_path / "data-before.sql")
    keys_dump = server.dump(keys, tmp_path / "keys-before.sql")
    for words in personal_words(GONE):
        assert words not in data_dump and words not in keys_dump

    erased = live.manage(
        "agentflow_erase",
        "--subject",
        owner_of(GONE).email,
        "--reason",
        "GDPR #42",
        "--actor",
        "dpo",
    )
    assert "erased: 1 key(s) destroyed; 1 run(s) kept" in erased

    # 1. The data's backup from before the erasure, restored beside the current keystore.
    restored = server.create("restored")
    server.restore(tmp_path / "data-before.sql", restored)
    beside_current = Site(server, clean_sandbox, restored, keys)
    after = beside_current.shell(READ)
    gone, kept = after[GONE], after[KEPT]
    assert gone["request"] == [ERASED] * 3
    assert gone["status"] == before[GONE]["status"] == "COMPLETED"
    # Every step and everything but the personal fields, amounts and partner references
    # included, as before; the personal fields erased.
    assert gone["steps"] == erased_where_personal(before[GONE]["steps"])
    assert gone["steps"]["fetch_booking"]["contact_email"] == ERASED
    shown = json.dumps(gone["steps"])
    assert '"amount_cents": ' in shown and "pi_" in shown, shown[:2000]
    for words in personal_words(GONE):
        assert words not in gone["pages"] and words not in gone["status_json"]
        assert words not in shown
    assert GONE in gone["pages"]  # the request is still listed, by its booking
    for part in ("request", "status", "steps"):  # the other customer: intact
        assert kept[part] == before[KEPT][part]
    assert owner_of(KEPT).email in kept["pages"]
    # The journal restored with the data lacks the erasure: replay journals it from the keystore.
    said = beside_current.manage("agentflow_erase", "--replay")
    assert "0 key(s) erased again; 1 erasure(s) journaled from the keystore" in said

    # 2. The keystore's backup from before the erasure, restored beside the current data: the
    # customer's key is back until the journal is replayed.
    old_keys = server.create("oldkeys")
    server.restore(tmp_path / "keys-before.sql", old_keys)
    beside_old = Site(server, clean_sandbox, data, old_keys)
    assert beside_old.shell(READ)[GONE]["request"][0] == owner_of(GONE).email
    said = beside_old.manage("agentflow_erase", "--replay")
    assert "replayed 1 journaled erasure(s): 1 key(s) erased again" in said
    replayed = beside_old.shell(READ)
    assert replayed[GONE]["request"] == [ERASED] * 3
    assert replayed[GONE]["steps"] == gone["steps"]
    assert replayed[KEPT]["request"] == before[KEPT]["request"]
    again = beside_old.manage("agentflow_erase", "--replay")
    assert "replayed 1 journaled erasure(s): 0 key(s) erased again; 0 erasure(s)" in again
