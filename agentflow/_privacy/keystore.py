"""Reading the keystore: a subject key unwrapped, a subject's digest, a run's binding.

Subject keys live in the keystore database (`AGENTFLOW_KEYSTORE_DATABASE`: the runs' own, or one
apart), wrapped by a master key that never does (it is a setting): a copy of a database alone
opens nothing. Their rows are written by the store alone (`agentflow._store.subject_keys`); this
module reads them, and keeps what it unwrapped briefly.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time

from django.db import connections

from agentflow._privacy import keys
from agentflow._privacy.models import RunSubject, SubjectKey
from agentflow.routers import keystore_database

#: The row holding the key subjects are hashed with (wrapped like a subject key, so it rotates
#: with them); its digest is no HMAC's (64 hex digits), so it never matches a subject.
HMAC_ROW = "hmac"
#: How long a process keeps an unwrapped subject key. Why not for ever: another process's
#: erasure reaches this one's cache only when it expires, so this bounds how long a worker
#: that already held the key may still read (docs/privacy.md, "Erasure"); why not 0: a status
#: page reads a run's fields under one key dozens of times.
CACHE_SECONDS = 5.0
#: Keys and bindings kept per process (a run's binding is fixed once it starts).
MAX_CACHED = 10_000

_lock = threading.Lock()
_cache: dict[str, tuple[float, bytes | None]] = {}
_bindings: dict[str, tuple[str, tuple[tuple[str, ...], ...]] | None] = {}


def enabled() -> bool:
    """Whether personal fields are sealed: a master key is configured."""
    return keys.current_master() is not None


def subject_digest(subject: str, hmac_key: bytes) -> str:
    """The subject's HMAC: how the keystore finds a person without holding who they are."""
    return hmac.new(hmac_key, subject.encode(), hashlib.sha256).hexdigest()


def hmac_key() -> bytes | None:
    """The key subjects are hashed with; None before the first subject key was made."""
    return data_key(HMAC_ROW)


def data_key(key_id: str) -> bytes | None:
    """The subject key `key_id`, unwrapped; None when it was erased (or never existed)."""
    now = time.monotonic()
    with _lock:
        found = _cache.get(key_id)
    if found is not None and found[0] > now:
        return found[1]
    row = SubjectKey.objects.filter(id=key_id).first()
    secret = unwrap(row) if row is not None else None
    if key_id != HMAC_ROW or not connections[keystore_database()].in_atomic_block:
        # The HMAC row is the one key another thread finds without being told its id: read
        # inside the transaction that made it, it may yet roll back, and a thread that hashed
        # with it would file its subjects under a key that never was.
        remember(key_id, secret)
    return secret


def remember(key_id: str, secret: bytes | None) -> None:
    with _lock:
        if len(_cache) > MAX_CACHED:
            _cache.clear()
        _cache[key_id] = (time.monotonic() + CACHE_SECONDS, secret)


def forget_cached() -> None:
    """Drop every unwrapped key this process holds (after an erasure, in tests)."""
    with _lock:
        _cache.clear()
        _bindings.clear()
    keys.forget_ciphers()


def unwrap(row: SubjectKey) -> bytes | None:
    if row.erased_at is not None or not row.wrapped:
        return None
    master = keys.master_named(row.master_key_id)
    return keys.unseal(master.secret, row.wrapped_nonce, row.wrapped, aad(row.id))


def aad(key_id: str) -> bytes:
    """What binds a wrapped key to its row: moved to another, it does not unwrap."""
    return f"agentflow-subject-key:{key_id}".encode()


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
        if len(_bindings) > MAX_CACHED:
            _bindings.clear()
        _bindings[run_id] = found
    return found


def key_ids_of(subject: str) -> list[str]:
    """Every key the subject ever had (live and erased)."""
    found = hmac_key()
    if found is None:
        return []
    digest = subject_digest(subject, found)
    return list(SubjectKey.objects.filter(subject_digest=digest).values_list("id", flat=True))


def runs_of(subject: str) -> list[str]:
    """Every run holding the subject's personal fields (under any of their keys)."""
    ids = key_ids_of(subject)
    return list(RunSubject.objects.filter(key_id__in=ids).values_list("run_id", flat=True))


def wrapped_by() -> dict[str, int]:
    """How many live keys each master key wraps."""
    counts: dict[str, int] = {}
    live = SubjectKey.objects.filter(erased_at__isnull=True)
    for master_id in live.values_list("master_key_id", flat=True):
        counts[master_id] = counts.get(master_id, 0) + 1
    return counts
