"""The keystore's tables: one key per person (in the keystore database), and, beside the runs,
which key a run's personal fields use and the journal of erasures."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from agentflow.routers import keystore_database


class KeystoreManager(models.Manager["SubjectKey"]):
    """Every query of subject keys goes to the keystore database, whatever other routers a
    host lists (a replica router must not send key reads to a copy that missed an erasure)."""

    def get_queryset(self) -> models.QuerySet[SubjectKey]:
        return super().get_queryset().using(keystore_database())


class SubjectKey(models.Model):
    """A person's data key, wrapped by a master key; erased, it is a tombstone (no key left)."""

    #: What envelopes name (`"k"`): random, so it says nothing of whose key it is.
    id = models.CharField(primary_key=True, max_length=40, editable=False)
    #: HMAC-SHA256 of the subject (docs/privacy.md, "The key hierarchy"): the person is found
    #: by it, never stored in clear.
    subject_digest = models.CharField(max_length=64)
    #: The master key that wrapped it ("" once erased).
    master_key_id = models.CharField(max_length=40, blank=True)
    wrapped_nonce = models.CharField(max_length=32, blank=True)
    wrapped = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    erased_at = models.DateTimeField(null=True, blank=True)
    erased_by = models.CharField(max_length=150, blank=True)
    erase_reason = models.TextField(blank=True)

    objects = KeystoreManager()

    class Meta:
        app_label = "agentflow"
        db_table = "agentflow_subjectkey"
        constraints = [
            # One live key per person; an erased person's tombstones stay beside a new key.
            models.UniqueConstraint(
                fields=["subject_digest"],
                condition=Q(erased_at__isnull=True),
                name="subjectkey_one_live_per_subject",
            ),
            # Erased means nothing left to unwrap.
            models.CheckConstraint(
                condition=Q(erased_at__isnull=True, wrapped__gt="")
                | Q(erased_at__isnull=False, wrapped=""),
                name="subjectkey_erased_has_no_key",
            ),
        ]
        indexes = [
            # Serves the rotation's batches: keys a master key other than the newest wrapped.
            models.Index(fields=["master_key_id", "id"], name="subjectkey_master_id"),
        ]
        permissions = [("erase_subjectkey", "Can erase a person's personal data")]


class RunSubject(models.Model):
    """Whose personal fields a run stores, and which of its fields are personal."""

    run_id = models.CharField(primary_key=True, max_length=40)
    key_id = models.CharField(max_length=40, db_index=True)
    #: The workflow's `Personal.fields` when the run started.
    fields = models.JSONField(default=list)

    class Meta:
        app_label = "agentflow"
        db_table = "agentflow_runsubject"


class ErasureJournal(models.Model):
    """One erasure, kept beside the runs: what `agentflow_erase --replay` applies again to a
    keystore restored from before it (docs/privacy.md, "Backups and restores"). It names keys,
    never the person."""

    key_ids = models.JSONField(default=list)
    erased_at = models.DateTimeField()
    erased_by = models.CharField(max_length=150)
    reason = models.TextField()

    class Meta:
        app_label = "agentflow"
        db_table = "agentflow_erasurejournal"
