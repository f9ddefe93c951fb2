"""The only writer of the keystore's rows (docs/privacy.md): a subject's key made, a run bound
to it, a subject erased (and journaled), erasures replayed, keys re-wrapped under the newest
master key.

Subject keys live in the keystore database (`agentflow.routers.keystore_database`), which may
be another than the runs'. A key is then made in a transaction of its own that commits before
the caller's: a run row never names a key that does not exist, and a key whose caller rolled
back is an orphan no row uses (harmless)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from agentflow._privacy import keys, keystore
from agentflow._privacy.models import ErasureJournal, RunSubject, SubjectKey
from agentflow.routers import keystore_database


@dataclass(frozen=True, kw_only=True)
class SubjectErased:
    keys: int
    runs: int


@dataclass(frozen=True, kw_only=True)
class ErasuresReplayed:
    #: Journaled erasures, and how many of their keys were live again (erased now).
    erasures: int
    erased_now: int
    #: Tombstones the journal lacked (a data database restored from before them), journaled now.
    journaled_now: int


def subject_key_for(subject: str) -> str:
    """The id of the subject's live key, made now if they have none (or were erased)."""
    digest = keystore.subject_digest(subject, _hmac_key())
    row = SubjectKey.objects.filter(subject_digest=digest, erased_at__isnull=True).first()
    if row is not None:
        return row.id
    key_id = f"sk_{secrets.token_hex(12)}"
    try:
        with transaction.atomic(using=keystore_database()):
            _create(key_id, digest, os.urandom(keys.KEY_BYTES))
    except IntegrityError:  # the same person's first two runs, at once
        return SubjectKey.objects.get(subject_digest=digest, erased_at__isnull=True).id
    return key_id


def subject_keys_for_many(subjects: Iterable[str]) -> dict[str, str]:
    """{subject: the id of their live key} for each subject, made now for those without one,
    as `subject_key_for` does one's (`durable.start_many`): a read of those that exist, one
    INSERT per thousand missing, a read of what was made. Each key read or made is remembered
    unwrapped for this process (`keystore.remember`), so sealing under it reads nothing more."""
    wanted = sorted(set(subjects))
    if not wanted:
        return {}
    hmac_key = _hmac_key()
    digests = {subject: keystore.subject_digest(subject, hmac_key) for subject in wanted}
    found: dict[str, str] = {}
    for row in _live(list(digests.values())):
        found[row.subject_digest] = row.id
        keystore.remember(row.id, keystore.unwrap(row))
    missing = sorted(set(digests.values()) - found.keys())
    if missing:
        master = keys.current_master()
        if master is None:
            raise keys.MasterKeyError("no master key is configured (AGENTFLOW_MASTER_KEYS)")
        rows, secrets_by_id = [], {}
        for digest in missing:
            key_id, secret = f"sk_{secrets.token_hex(12)}", os.urandom(keys.KEY_BYTES)
            nonce, wrapped = keys.seal(master.secret, secret, keystore.aad(key_id))
            rows.append(
                SubjectKey(
                    id=key_id,
                    subject_digest=digest,
                    master_key_id=master.id,
                    wrapped_nonce=nonce,
                    wrapped=wrapped,
                )
            )
            secrets_by_id[key_id] = secret
        # A person another process gave a key meanwhile keeps theirs (the one live key each).
        SubjectKey.objects.bulk_create(rows, batch_size=1000, ignore_conflicts=True)
        for row in _live(missing):
            found[row.subject_digest] = row.id
            keystore.remember(row.id, secrets_by_id.get(row.id) or keystore.unwrap(row))
    return {subject: found[digest] for subject, digest in digests.items()}


def _live(digests: Sequence[str]) -> list[SubjectKey]:
    return list(SubjectKey.objects.filter(subject_digest__in=digests, erased_at__isnull=True))


def _hmac_key() -> bytes:
    found = keystore.hmac_key()
    if found is not None:
        return found
    try:
        with transaction.atomic(using=keystore_database()):
            _create(keystore.HMAC_ROW, keystore.HMAC_ROW, os.urandom(keys.KEY_BYTES))
    except IntegrityError:  # another process made it first
        pass
    keystore.forget_cached()
    made = keystore.hmac_key()
    assert made is not None
    return made


def _create(key_id: str, digest: str, secret: bytes) -> None:
    master = keys.current_master()
    if master is None:
        raise keys.MasterKeyError("no master key is configured (AGENTFLOW_MASTER_KEYS)")
    nonce, wrapped = keys.seal(master.secret, secret, keystore.aad(key_id))
    SubjectKey.objects.create(
        id=key_id,
        subject_digest=digest,
        master_key_id=master.id,
        wrapped_nonce=nonce,
        wrapped=wrapped,
    )


def run_subject_bind(run_id: str, key_id: str, fields: list[str]) -> None:
    """Record whose key seals run `run_id`'s personal fields (in the run's own transaction)."""
    RunSubject.objects.get_or_create(run_id=run_id, defaults={"key_id": key_id, "fields": fields})


def runs_subject_bind_many(bindings: Sequence[tuple[str, str, list[str]]]) -> None:
    """`run_subject_bind` for each (run id, key id, fields): one INSERT per thousand."""
    RunSubject.objects.bulk_create(
        [RunSubject(run_id=run_id, key_id=key, fields=fields) for run_id, key, fields in bindings],
        batch_size=1000,
        ignore_conflicts=True,
    )


def subject_erase(subject: str, *, actor: str, reason: str) -> SubjectErased:
    """Destroy the subject's live keys: their sealed fields, in every copy, open to nothing.

    Journaled first, beside the runs: a keystore never holds a tombstone the journal lacks, so
    a keystore restored from before it gets it back with `erasures_replay`; a journaled
    erasure whose tombstone failed is done by the next replay (or erase)."""
    live = list(
        SubjectKey.objects.filter(
            id__in=keystore.key_ids_of(subject), erased_at__isnull=True
        ).values_list("id", flat=True)
    )
    if not live:
        return SubjectErased(keys=0, runs=0)
    when, actor = timezone.now(), actor[:150]
    ErasureJournal.objects.create(key_ids=live, erased_at=when, erased_by=actor, reason=reason)
    erased = _tombstone(live, when=when, actor=actor, reason=reason)
    keystore.forget_cached()
    return SubjectErased(
        keys=len(erased), runs=RunSubject.objects.filter(key_id__in=erased).count()
    )


def _tombstone(key_ids: list[str], *, when: datetime, actor: str, reason: str) -> list[str]:
    """Erase those of `key_ids` still live; the ids erased now."""
    with transaction.atomic(using=keystore_database()):
        live = SubjectKey.objects.select_for_update().filter(id__in=key_ids, erased_at__isnull=True)
        erased = list(live.values_list("id", flat=True))
        SubjectKey.objects.filter(id__in=erased).update(
            wrapped="",
            wrapped_nonce="",
            master_key_id="",
            erased_at=when,
            erased_by=actor,
            erase_reason=reason,
        )
    return erased


def erasures_replay() -> ErasuresReplayed:
    """Bring the journal and the keystore level after a restore: every journaled erasure
    applied to the keystore (one restored from before it), every tombstone the journal lacks
    journaled (a data database restored from before it). Idempotent."""
    journal = list(ErasureJournal.objects.order_by("erased_at", "id"))
    erased_now = 0
    for entry in journal:
        erased_now += len(
            _tombstone(
                [str(k) for k in entry.key_ids],
                when=entry.erased_at,
                actor=entry.erased_by,
                reason=entry.reason,
            )
        )
    journaled = {str(k) for entry in journal for k in entry.key_ids}
    missing: dict[tuple[datetime, str, str], list[str]] = {}
    tombstones = SubjectKey.objects.filter(erased_at__isnull=False).order_by("erased_at", "id")
    for key_id, when, actor, reason in tombstones.values_list(
        "id", "erased_at", "erased_by", "erase_reason"
    ):
        if key_id not in journaled and when is not None:
            missing.setdefault((when, actor, reason), []).append(key_id)
    ErasureJournal.objects.bulk_create(
        ErasureJournal(key_ids=ids, erased_at=when, erased_by=actor, reason=reason)
        for (when, actor, reason), ids in missing.items()
    )
    keystore.forget_cached()
    return ErasuresReplayed(
        erasures=len(journal), erased_now=erased_now, journaled_now=len(missing)
    )


def subject_keys_rewrap(size: int) -> tuple[int, int]:
    """Re-wrap up to `size` keys a master key other than the newest wrapped; (done, left)."""
    master = keys.current_master()
    if master is None:
        raise keys.MasterKeyError("no master key is configured (AGENTFLOW_MASTER_KEYS)")
    stale = SubjectKey.objects.filter(erased_at__isnull=True).exclude(master_key_id=master.id)
    with transaction.atomic(using=keystore_database()):
        rows = list(stale.select_for_update(skip_locked=True).order_by("id")[:size])
        for row in rows:
            secret = keystore.unwrap(row)
            assert secret is not None
            nonce, wrapped = keys.seal(master.secret, secret, keystore.aad(row.id))
            SubjectKey.objects.filter(id=row.id, master_key_id=row.master_key_id).update(
                master_key_id=master.id, wrapped_nonce=nonce, wrapped=wrapped
            )
    return len(rows), stale.count()
