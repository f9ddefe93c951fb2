"""Personal fields sealed at rest under a key per person (issue 42, docs/privacy.md): what the
rows hold, what the engine and the admin read, erasure that keeps the run, a master key rotation
that resumes. Real Postgres; runs driven in this process as a worker's task would."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test import Client, override_settings
from django.test.utils import CaptureQueriesContext

from agentflow import _store as store
from agentflow import durable, testing
from agentflow._privacy import keys, keystore, scope
from agentflow.models import RunSubject, StepCheckpoint, SubjectKey, WorkflowRun

pytestmark = pytest.mark.django_db(transaction=True)

OLD = "old:" + keys.b64encode(b"o" * 32)
NEW = "new:" + keys.b64encode(b"n" * 32)
EMAIL = "ada.quillfeather@example.org"
NAME = "Ada Quillfeather"
NOTE = "admitted to St Brigid's with appendicitis"

care = durable.Workflow(
    "privacy_care",
    personal=durable.Personal(
        subject=lambda input: input["email"], fields=["email", "name", "note.text"]
    ),
)


@care.step("greet")
def greet(ctx: durable.StepContext) -> dict[str, Any]:
    return {
        "name": ctx.input["name"],
        "amount_cents": 1250,
        "note": {"text": ctx.input["note"]["text"], "kept": "visible"},
    }


@care.step("confirm")
def confirm(ctx: durable.StepContext) -> dict[str, Any]:
    # A later step reads an earlier one's personal field in clear (the worker opens it).
    return {"email": ctx.input["email"], "name": ctx.output_of("greet")["name"]}


@pytest.fixture(autouse=True)
def _keys() -> Any:
    keystore.forget_cached()
    with override_settings(AGENTFLOW_MASTER_KEYS=[OLD]):
        yield
    keystore.forget_cached()


def start(email: str = EMAIL) -> str:
    return durable.start(care.name, input={"email": email, "name": NAME, "note": {"text": NOTE}})


def rows_text() -> str:
    """Everything the engine's tables hold, as text: what a dump of them would show."""
    with connection.cursor() as cursor:
        parts = []
        for table in ("agentflow_workflowrun", "agentflow_stepcheckpoint", "agentflow_runevent"):
            cursor.execute(f"SELECT t::text FROM {table} t")
            parts += [row[0] for row in cursor.fetchall()]
    return "\n".join(parts)


def test_personal_fields__sealed_in_the_rows__read_in_clear_by_the_steps_and_the_api() -> None:
    run_id = start()

    run = testing.run_to_end(run_id)

    assert run.status == durable.RunStatus.COMPLETED, run.error
    stored = rows_text()
    for secret in (EMAIL, NAME, "appendicitis", "Quillfeather"):
        assert secret not in stored
    # (a row as text doubles its quotes)
    assert '""amount_cents"": 1250' in stored and '""kept"": ""visible""' in stored
    outputs = {s.name: s.output for s in run.steps}
    assert outputs["greet"] == {
        "name": NAME,
        "amount_cents": 1250,
        "note": {"text": NOTE, "kept": "visible"},
    }
    assert outputs["confirm"] == {"email": EMAIL, "name": NAME}
    assert WorkflowRun.objects.get(id=run_id).input["email"] == EMAIL
    assert RunSubject.objects.get(run_id=run_id).fields == ["email", "name", "note.text"]


def test_erase__personal_fields_read_erased__the_run_and_its_amounts_stay() -> None:
    gone, kept = start(), start("grace.other@example.org")
    testing.run_to_end(gone)
    testing.run_to_end(kept)

    call_command("agentflow_erase", subject=EMAIL, reason="GDPR request #77", actor="dpo")

    run = durable.snapshot(gone)
    assert run is not None and run.status == durable.RunStatus.COMPLETED
    greet_out = StepCheckpoint.objects.get(run_id=gone, name="greet").output
    assert greet_out == {
        "name": "erased",
        "amount_cents": 1250,
        "note": {"text": "erased", "kept": "visible"},
    }
    assert WorkflowRun.objects.get(id=gone).input == {
        "email": "erased",
        "name": "erased",
        "note": {"text": "erased"},
    }
    other = durable.snapshot(kept)
    assert other is not None and other.steps[1].output["email"] == "grace.other@example.org"
    [tombstone] = SubjectKey.objects.filter(erased_at__isnull=False)
    assert (tombstone.erased_by, tombstone.erase_reason, tombstone.wrapped) == (
        "dpo",
        "GDPR request #77",
        "",
    )
    # A copy written later (a fork keeps its copies) holds nothing left to seal.
    with scope.sealing(tombstone.id, (("name",),)):
        assert scope.seal_stored({"name": NAME, "amount_cents": 5}) == {
            "name": "erased",
            "amount_cents": 5,
        }


def test_erase__a_run_in_flight__refused_with_the_reason_until_cancelled() -> None:
    run_id = start()  # not run: still PENDING

    with pytest.raises(CommandError, match="still in flight") as refused:
        call_command("agentflow_erase", subject=EMAIL, reason="asked", actor="dpo")
    assert run_id in str(refused.value)
    assert SubjectKey.objects.filter(erased_at__isnull=False).count() == 0

    with pytest.raises(CommandError, match="Erase again once they have ended"):
        call_command(
            "agentflow_erase", subject=EMAIL, reason="asked", actor="dpo", cancel_in_flight=True
        )
    run = testing.run_to_end(run_id)
    assert run.status == durable.RunStatus.CANCELLED
    call_command("agentflow_erase", subject=EMAIL, reason="asked", actor="dpo")
    assert WorkflowRun.objects.get(id=run_id).input["name"] == "erased"


def test_rotate__in_batches_with_progress__resumes__then_the_old_key_can_go(capsys: Any) -> None:
    run_ids = [start(f"person{i}@example.org") for i in range(5)]
    for run_id in run_ids:
        testing.run_to_end(run_id)

    with override_settings(AGENTFLOW_MASTER_KEYS=[NEW, OLD]):
        keystore.forget_cached()
        assert store.subject_keys_rewrap(2) == (2, 4)  # stopped here: 4 of 6 (the hmac key too)
        call_command("agentflow_rotate_keys", batch=3)
    said = capsys.readouterr().out
    assert "re-wrapped 3 of 4 under new; 1 left" in said
    assert "re-wrapped 4 of 4 under new; 0 left" in said
    assert "every live key is wrapped by new (new: 6)" in said

    with override_settings(AGENTFLOW_MASTER_KEYS=[NEW]):
        keystore.forget_cached()
        run = durable.snapshot(run_ids[3])
        assert run is not None and run.steps[1].output["email"] == "person3@example.org"


def test_no_master_key__nothing_is_sealed() -> None:
    with override_settings(AGENTFLOW_MASTER_KEYS=[]):
        run = testing.run_to_end(start())
    assert run.status == durable.RunStatus.COMPLETED
    assert NAME in rows_text()
    assert not RunSubject.objects.exists()


def test_signal_payload__its_personal_fields_are_sealed() -> None:
    run_id = start()
    durable.signal(run_id, "note", {"name": NAME, "size": 3}, signal_id="s1")

    with connection.cursor() as cursor:
        cursor.execute("SELECT payload::text FROM agentflow_runsignal")
        [(payload,)] = cursor.fetchall()
    assert NAME not in payload and '"size": 3' in payload
    assert json.loads(payload)["name"]["$enc"] == "v1"


def test_master_keys__a_bad_entry_is_refused_by_check() -> None:
    with override_settings(AGENTFLOW_MASTER_KEYS=["nocolon"]), pytest.raises(Exception) as bad:
        call_command("check")
    assert "agentflow.E011" in str(bad.value)


# --- the admin's erasure page ------------------------------------------------------------------
ERASE_URL = "/admin/agentflow/subjectkey/"


def staff(*codenames: str) -> Client:
    user = User.objects.create_user("-".join(codenames) or "plain", password="x", is_staff=True)
    for codename in codenames:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def test_erase_page__only_with_its_own_permission__recorded_and_never_showing_the_subject() -> None:
    run_id = start()
    testing.run_to_end(run_id)
    reader = staff("view_workflowrun", "approve_workflowrun")
    assert reader.get(ERASE_URL).status_code == 403
    assert reader.post(ERASE_URL, {"subject": EMAIL, "reason": "x"}).status_code == 403
    eraser = staff("erase_subjectkey")

    refused = eraser.post(ERASE_URL, {"subject": EMAIL, "reason": ""})
    assert (
        refused.status_code == 200
        and SubjectKey.objects.filter(erased_at__isnull=False).count() == 0
    )
    done = eraser.post(ERASE_URL, {"subject": EMAIL, "reason": "GDPR #9"}, follow=True)

    page = done.content.decode()
    assert "Erased: 1 key(s) destroyed; 1 run(s) kept." in page
    assert EMAIL not in page and NAME not in page and "GDPR #9" in page
    [tombstone] = SubjectKey.objects.filter(erased_at__isnull=False)
    assert tombstone.erased_by == "erase_subjectkey" and tombstone.id in page
    assert WorkflowRun.objects.get(id=run_id).input["name"] == "erased"


@pytest.mark.parametrize(
    ("command", "args", "says"),
    [
        ("agentflow_erase", ["--reason=x"], "not erased: name the subject"),
        (
            "agentflow_erase",
            ["--replay", "--subject=a@b.c"],
            "--replay erases what the journal names: give no --subject",
        ),
        ("agentflow_erase", ["--subject= ", "--reason=x"], "not erased: name the subject"),
        (
            "agentflow_erase",
            ["--subject=a@b.c", "--reason= "],
            "not erased: an erasure is recorded",
        ),
        (
            "agentflow_rotate_keys",
            ["--batch=0"],
            "Error: argument --batch: '0' is not a whole number",
        ),
    ],
)
def test_commands__bad_input__one_line(command: str, args: list[str], says: str) -> None:
    with pytest.raises(CommandError) as refused:
        call_command(command, *args)
    assert str(refused.value).startswith(says), refused.value
    assert "\n" not in str(refused.value)


def test_start_many__each_run_sealed_under_its_subjects_key_and_bound__in_a_few_statements() -> (
    None
):
    known = start("known.before@example.org")  # a subject whose key exists already
    emails = [f"p{i}.passenger@example.org" for i in range(400)] + ["known.before@example.org"]
    runs = [
        (care.name, {"email": e, "name": f"Name{i}", "note": {"text": NOTE}}, f"bulk-{i}")
        for i, e in enumerate(emails * 2)  # each subject twice: one key each
    ]
    keystore.forget_cached()
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        ids = durable.start_many(runs)
    writes = [
        q for q in queries.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]
    # keys: the hmac key, a read, an insert, a read back; runs: an insert, a read of the keyed
    # ids, the bindings: far from one per run (802 here).
    assert len(writes) <= 10, [q["sql"][:80] for q in writes]
    print(f"\nstart_many of 802 sealed runs, 401 subjects (400 new): {len(writes)} statements")

    stored = rows_text()
    assert "passenger@example.org" not in stored and '""Name1""' not in stored
    bound = dict(RunSubject.objects.filter(run_id__in=ids).values_list("run_id", "key_id"))
    assert len(bound) == len(ids) == 802
    assert bound[ids[0]] == bound[ids[401]] != bound[ids[1]]  # one key per subject
    assert bound[ids[400]] == RunSubject.objects.get(run_id=known).key_id
    assert SubjectKey.objects.count() == 1 + 401  # the hmac key's row, one per subject
    run = testing.run_to_end(ids[1])
    assert run.status == durable.RunStatus.COMPLETED, run.error
    assert {s.name: s.output for s in run.steps}["confirm"]["email"] == emails[1]
    testing.run_to_end(ids[402])  # the subject's other run: erasure waits for both to end

    call_command("agentflow_erase", subject=emails[1], reason="GDPR #40", actor="dpo")
    keystore.forget_cached()
    assert WorkflowRun.objects.get(id=ids[1]).input["email"] == "erased"
    assert WorkflowRun.objects.get(id=ids[402]).input["name"] == "erased"
    assert WorkflowRun.objects.get(id=ids[2]).input["email"] == emails[2]


def test_start_many__no_master_key__nothing_sealed_or_bound() -> None:
    with override_settings(AGENTFLOW_MASTER_KEYS=[]):
        ids = durable.start_many([(care.name, {"email": EMAIL, "name": NAME, "note": {}}, None)])
    assert WorkflowRun.objects.get(id=ids[0]).input["email"] == EMAIL
    assert NAME in rows_text()
    assert not RunSubject.objects.exists()
