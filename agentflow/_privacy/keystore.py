"""The only writer of the keystore's rows: subject keys made, unwrapped, erased, re-wrapped.

Subject keys live in this database, wrapped by a master key that never does (it is a setting):
a copy of the database alone opens nothing. Erasing a subject replaces its wrapped key with a
tombstone, which every copy made from then on carries (docs/privacy.md, "Erasure").
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from agentflow._privacy import keys
from agentflow._privacy.models import RunSubject, SubjectKey

#: The row holding the key subjects are hashed with (wrapped like a subject key, so it rotates
#: with them); its digest is no HMAC's (64 hex digits), so it never matches a subject.
HMAC_ROW = "hmac"
#: How long a process keeps an unwrapped subject key. Why not for ever: another process's
#: erasure reaches this one's cache only when it expires, so this bounds how long a worker
#: that already held the key may still read (docs/privacy.md, "Erasure"); why not 0: a status
#: page reads a run's fields under one key dozens of times.
CACHE_SECONDS = 5.0

_lock = threading.Lock()
_cache: dict[str, tuple[float, bytes | None]] = {}
_bindings: dict[str, tuple[str, tuple[tuple[str, ...], ...]] | None] = {}
#: Bindings kept per process: a run's is fixed once it starts, so only memory bounds it.
_MAX_BINDINGS = 10_000


@dataclass(frozen=True, kw_only=True)
class Erased:
    keys: int
    runs: int


def enabled() -> bool:
    """Whether personal fields are sealed: a master key is configured."""
    return keys.current_master() is not None


def subject_digest(subject: str) -> str:
    """The subject's HMAC: how the keystore finds a person without holding who they are."""
    return hmac.new(_hmac_key(), subject.encode(), hashlib.sha256).hexdigest()


def _hmac_key() -> bytes:
    cached = _cached(HMAC_ROW)
    if cached is not None:
        return cached
    row = SubjectKey.objects.filter(id=HMAC_ROW).first()
    if row is None:
        try:
            with transaction.atomic():
                row = _create(HMAC_ROW, HMAC_ROW, os.urandom(keys.KEY_BYTES))
        except IntegrityError:  # another process made it first
            row = SubjectKey.objects.get(id=HMAC_ROW)
    found = _unwrap(row)
    assert found is not None
    _remember(HMAC_ROW, found)
    return found


def key_for_subject(subject: str) -> str:
    """The id of the subject's live key, made now if they have none (or were erased)."""
    digest = subject_digest(subject)
    row = SubjectKey.objects.filter(subject_digest=digest, erased_at__isnull=True).first()
    if row is not None:
        return row.id
    key_id = f"sk_{secrets.token_hex(12)}"
    try:
        with transaction.atomic():
            _create(key_id, digest, os.urandom(keys.KEY_BYTES))
    except IntegrityError:  # the same person's first two runs, at once
        return SubjectKey.objects.get(subject_digest=digest, erased_at__isnull=True).id
    return key_id


def _create(key_id: str, digest: str, secret: bytes) -> SubjectKey:
    master = keys.current_master()
    if master is None:
        raise keys.MasterKeyError("no master key is configured (AGENTFLOW_MASTER_KEYS)")
    nonce, wrapped = keys.seal(master.secret, secret, _aad(key_id))
    return SubjectKey.objects.create(
        id=key_id, subject_digest=digest, master_key_id=master.id, wrapped_nonce=nonce,
        wrapped=wrapped,
    )  # fmt: skip


def data_key(key_id: str) -> bytes | None:
    """The subject key `key_id`, unwrapped; None when it was erased (or never existed)."""
    now = time.monotonic()
    with _lock:
        found = _cache.get(key_id)
    if found is not None and found[0] > now:
        return found[1]
    row = SubjectKey.objects.filter(id=key_id).first()
    secret = _unwrap(row) if row is not None else None
    _remember(key_id, secret)
    return secret


def _cached(key_id: str) -> bytes | None:
    with _lock:
        found = _cache.get(key_id)
    return found[1] if found is not None and found[0] > time.monotonic() else None


def _remember(key_id: str, secret: bytes | None) -> None:
    with _lock:
        if len(_cache) > _MAX_BINDINGS:
            _cache.clear()
        _cache[key_id] = (time.monotonic() + CACHE_SECONDS, secret)


def forget_cached() -> None:
    """Drop every unwrapped key this process holds (after an erasure, in tests)."""
    with _lock:
        _cache.clear()
        _bindings.clear()


def _unwrap(row: SubjectKey) -> bytes | None:
    if row.erased_at is not None or not row.wrapped:
        return None
    master = keys.master_named(row.master_key_id)
    return keys.unseal(master.secret, row.wrapped_nonce, row.wrapped, _aad(row.id))


def _aad(key_id: str) -> bytes:
    return f"agentflow-subject-key:{key_id}".encode()


def bind_run(run_id: str, key_id: str, fields: list[str]) -> None:
    """Record whose key seals run `run_id`'s personal fields (in the run's own transaction)."""
    RunSubject.objects.get_or_create(run_id=run_id, defaults={"key_id": key_id, "fields": fields})


def binding(run_id: str) -> tuple[str, tuple[tuple[str, ...], ...]] | None:
    """(key id, personal paths) of run `run_id`; None for a run with nothing personal."""
    with _lock:
        if run_id in _bindings:
            return _bindings[run_id]
    row = RunSubject.objects.filter(run_id=run_id).first()
    found = (
        (row.key_id, tuple(tuple(str(f).split(".")) for f in row.fields))
        if row is not None
        else None
    )
    with _lock:
        if len(_bindings) > _MAX_BINDINGS:
            _bindings.clear()
        _bindings[run_id] = found
    return found


def runs_of(subject: str) -> list[str]:
    """Every run holding the subject's personal fields (under any of their keys)."""
    digest = subject_digest(subject)
    key_ids = SubjectKey.objects.filter(subject_digest=digest).values_list("id", flat=True)
    return list(
        RunSubject.objects.filter(key_id__in=list(key_ids)).values_list("run_id", flat=True)
    )


def erase(subject: str, *, actor: str, reason: str) -> Erased:
    """Destroy the subject's keys: their sealed fields, in every copy, open to nothing."""
    digest = subject_digest(subject)
    with transaction.atomic():
        live = SubjectKey.objects.select_for_update().filter(
            subject_digest=digest, erased_at__isnull=True
        )
        ids = list(live.values_list("id", flat=True))
        SubjectKey.objects.filter(id__in=ids).update(
            wrapped="", wrapped_nonce="", master_key_id="", erased_at=timezone.now(),
            erased_by=actor[:150], erase_reason=reason,
        )  # fmt: skip
        runs = RunSubject.objects.filter(key_id__in=ids).count()
    forget_cached()
    return Erased(keys=len(ids), runs=runs)


def rewrap_batch(size: int) -> tuple[int, int]:
    """Re-wrap up to `size` keys a master key other than the newest wrapped; (done, left)."""
    master = keys.current_master()
    if master is None:
        raise keys.MasterKeyError("no master key is configured (AGENTFLOW_MASTER_KEYS)")
    stale = SubjectKey.objects.filter(erased_at__isnull=True).exclude(master_key_id=master.id)
    with transaction.atomic():
        rows = list(stale.select_for_update(skip_locked=True).order_by("id")[:size])
        for row in rows:
            secret = _unwrap(row)
            assert secret is not None
            nonce, wrapped = keys.seal(master.secret, secret, _aad(row.id))
            SubjectKey.objects.filter(id=row.id, master_key_id=row.master_key_id).update(
                master_key_id=master.id, wrapped_nonce=nonce, wrapped=wrapped
            )
    return len(rows), stale.count()


def wrapped_by() -> dict[str, int]:
    """How many live keys each master key wraps."""
    counts: dict[str, int] = {}
    for master_id in SubjectKey.objects.filter(erased_at__isnull=True).values_list(
        "master_key_id", flat=True
    ):
        counts[master_id] = counts.get(master_id, 0) + 1
    return counts
