"""The keystore apart from the data (docs/privacy.md, "Backups and restores"): the router, the
system checks that say when it is misplaced, and `agentflow_erase --replay` after a restore.
Real Postgres; the keystore in the default database, as the suite runs (the acceptance test
tests/refunds/acceptance/test_keystore_apart.py runs it in a database of its own)."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.core import checks
from django.core.management import call_command
from django.test import override_settings

from agentflow import durable, testing
from agentflow._privacy import keys, keystore
from agentflow.models import ErasureJournal, RunSubject, SubjectKey, WorkflowRun
from agentflow.routers import KeystoreRouter

MASTER = "mk:" + keys.b64encode(b"k" * 32)
EMAIL = "lin.quarrow@example.org"

care = durable.Workflow(
    "keystore_care",
    personal=durable.Personal(subject=lambda input: input["email"], fields=["email", "name"]),
)


@care.step("greet")
def greet(ctx: durable.StepContext) -> dict[str, Any]:
    return {"name": ctx.input["name"], "amount_cents": 700}


@pytest.fixture(autouse=True)
def _keys() -> Any:
    keystore.forget_cached()
    with override_settings(AGENTFLOW_MASTER_KEYS=[MASTER]):
        yield
    keystore.forget_cached()


# --- the router ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("db", "app_label", "model_name", "allowed"),
    [
        ("keystore", "agentflow", "subjectkey", True),  # the key table: there ...
        ("default", "agentflow", "subjectkey", False),  # ... and nowhere else
        ("keystore", "agentflow", "runsubject", False),  # the keystore holds nothing else
        ("keystore", "agentflow", "erasurejournal", False),
        ("keystore", "auth", "user", False),
        ("keystore", "agentflow", None, False),  # a migration's SQL without a model
        ("default", "agentflow", "workflowrun", None),  # the data: the host's routers say
        ("default", "auth", "user", None),
    ],
)
def test_router__keystore_apart__its_table_alone_there_and_nowhere_else(
    db: str, app_label: str, model_name: str | None, allowed: bool | None
) -> None:
    with override_settings(AGENTFLOW_KEYSTORE_DATABASE="keystore"):
        assert KeystoreRouter().allow_migrate(db, app_label, model_name) is allowed


def test_router__keys_read_and_written_in_the_keystore__the_rest_left_to_others() -> None:
    router = KeystoreRouter()
    with override_settings(AGENTFLOW_KEYSTORE_DATABASE="keystore"):
        assert router.db_for_read(SubjectKey) == router.db_for_write(SubjectKey) == "keystore"
        assert router.db_for_read(RunSubject) is None and router.db_for_write(WorkflowRun) is None
        # The model's queries name the keystore themselves, whatever router comes first.
        assert SubjectKey.objects.filter(id="x").db == "keystore"
        assert RunSubject.objects.all().db == "default"


def test_router__keystore_in_the_default_database__says_nothing() -> None:
    router = KeystoreRouter()
    assert router.allow_migrate("default", "agentflow", "subjectkey") is None
    assert router.db_for_read(SubjectKey) == "default"
    assert SubjectKey.objects.all().db == "default"


# --- the system checks --------------------------------------------------------------------------
def found(**changed: Any) -> list[str]:
    with override_settings(**changed):
        return [
            m.id or ""
            for m in checks.run_checks(tags=[checks.Tags.security])
            if (m.id or "").startswith(("agentflow.E012", "agentflow.W009"))
        ]


def keystore_databases(**keystore: Any) -> dict[str, Any]:
    default = settings.DATABASES["default"]
    return {"default": default, "keystore": {**default, "NAME": "elsewhere", **keystore}}


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_check__the_keystore_alias_must_be_configured_and_routed() -> None:
    assert found(AGENTFLOW_KEYSTORE_DATABASE="nowhere") == ["agentflow.E012"]
    apart = keystore_databases()
    assert found(AGENTFLOW_KEYSTORE_DATABASE="keystore", DATABASES=apart) == ["agentflow.E012"]
    routed = {"DATABASES": apart, "DATABASE_ROUTERS": ["agentflow.routers.KeystoreRouter"]}
    assert found(AGENTFLOW_KEYSTORE_DATABASE="keystore", DEBUG=False, **routed) == []
    with override_settings(AGENTFLOW_KEYSTORE_DATABASE="keystore", DATABASES=apart):
        [message] = [
            m for m in checks.run_checks(tags=[checks.Tags.security]) if m.id == "agentflow.E012"
        ]
    assert "agentflow.routers.KeystoreRouter" in message.msg


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_check__keys_beside_the_data_in_production__warned() -> None:
    assert found(DEBUG=False) == ["agentflow.W009"]
    assert found(DEBUG=True) == []
    assert found(DEBUG=False, AGENTFLOW_MASTER_KEYS=[]) == []  # nothing is sealed
    # Another alias for the same database keeps nothing apart.
    same = keystore_databases(NAME=settings.DATABASES["default"]["NAME"])
    assert found(
        DEBUG=False,
        AGENTFLOW_KEYSTORE_DATABASE="keystore",
        DATABASES=same,
        DATABASE_ROUTERS=["agentflow.routers.KeystoreRouter"],
    ) == ["agentflow.W009"]


# --- the erasure journal and --replay -----------------------------------------------------------
def start(email: str) -> str:
    run_id = durable.start(care.name, input={"email": email, "name": "Lin Quarrow"})
    testing.run_to_end(run_id)
    return run_id


@pytest.mark.django_db(transaction=True)
def test_replay__a_keystore_restored_from_before_an_erasure__erased_again(capsys: Any) -> None:
    gone, kept = start(EMAIL), start("other.person@example.org")
    key_id = RunSubject.objects.get(run_id=gone).key_id
    backup = SubjectKey.objects.filter(id=key_id).values().get()  # the keystore's backup

    call_command("agentflow_erase", subject=EMAIL, reason="GDPR #5", actor="dpo")
    [entry] = ErasureJournal.objects.all()
    assert (entry.key_ids, entry.erased_by, entry.reason) == ([key_id], "dpo", "GDPR #5")
    assert EMAIL not in str(ErasureJournal.objects.values().get())  # keys, never the person

    SubjectKey.objects.filter(id=key_id).update(**backup)  # the keystore restored
    keystore.forget_cached()
    assert WorkflowRun.objects.get(id=gone).input["email"] == EMAIL  # back, until replayed

    call_command("agentflow_erase", "--replay")
    call_command("agentflow_erase", "--replay")  # idempotent

    said = capsys.readouterr().out.splitlines()
    assert said[-2:] == [
        "replayed 1 journaled erasure(s): 1 key(s) erased again; 0 erasure(s) journaled from "
        "the keystore",
        "replayed 1 journaled erasure(s): 0 key(s) erased again; 0 erasure(s) journaled from "
        "the keystore",
    ]
    assert WorkflowRun.objects.get(id=gone).input == {"email": "erased", "name": "erased"}
    tombstone = SubjectKey.objects.get(id=key_id)
    assert (tombstone.wrapped, tombstone.erased_by, tombstone.erase_reason) == (
        "",
        "dpo",
        "GDPR #5",
    )
    assert tombstone.erased_at == entry.erased_at
    assert WorkflowRun.objects.get(id=kept).input["email"] == "other.person@example.org"


@pytest.mark.django_db(transaction=True)
def test_replay__data_restored_from_before_an_erasure__journaled_from_the_keystore(
    capsys: Any,
) -> None:
    gone = start(EMAIL)
    call_command("agentflow_erase", subject=EMAIL, reason="GDPR #6", actor="dpo")
    [entry] = ErasureJournal.objects.values("key_ids", "erased_at", "erased_by", "reason")
    ErasureJournal.objects.all().delete()  # the data restored from before the erasure

    assert WorkflowRun.objects.get(id=gone).input["email"] == "erased"  # nothing to do for that
    call_command("agentflow_erase", "--replay")

    assert "0 key(s) erased again; 1 erasure(s) journaled from the keystore" in (
        capsys.readouterr().out
    )
    assert list(ErasureJournal.objects.values("key_ids", "erased_at", "erased_by", "reason")) == [
        entry
    ]
