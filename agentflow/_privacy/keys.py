"""Master keys from settings, and the AES-GCM sealing every other key and value goes through.

`AGENTFLOW_MASTER_KEYS` is a list of "id:key" entries (the key: 32 random bytes, URL-safe
base64). The first one wraps new subject keys; every one listed unwraps, so a new master key is
put first, `agentflow_rotate_keys` re-wraps what the old one wrapped, and the old one is then
removed (docs/privacy.md, "Rotating the master key").
"""

from __future__ import annotations

import base64
import os
import re
import secrets
from dataclasses import dataclass
from functools import lru_cache

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agentflow._conf import settings
from agentflow.exceptions import MasterKeyError

#: AES-256: the key size every current guidance recommends for data kept for years.
KEY_BYTES = 32
#: GCM's standard nonce; random per message, far below the 2**32 messages per key it allows.
NONCE_BYTES = 12
_KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")


@dataclass(frozen=True, kw_only=True)
class MasterKey:
    id: str
    secret: bytes


def master_keys() -> list[MasterKey]:
    """The configured master keys, newest (the one that wraps) first; [] when none is."""
    raw = settings.AGENTFLOW_MASTER_KEYS
    entries = [e.strip() for e in raw.split(",")] if isinstance(raw, str) else list(raw)
    found: list[MasterKey] = []
    for entry in entries:
        if not entry:
            continue
        key_id, _, text = str(entry).partition(":")
        if not _KEY_ID.match(key_id) or not text:
            raise MasterKeyError(
                "AGENTFLOW_MASTER_KEYS entries are 'id:key' (id: letters, digits, '._-'); "
                "make one with `manage.py agentflow_rotate_keys --new-key`"
            )
        secret = _b64decode(text)
        if secret is None or len(secret) != KEY_BYTES:
            raise MasterKeyError(
                f"master key {key_id!r} is not {KEY_BYTES} bytes of URL-safe base64"
            )
        if any(k.id == key_id for k in found):
            raise MasterKeyError(f"master key id {key_id!r} is listed twice")
        found.append(MasterKey(id=key_id, secret=secret))
    return found


def new_master_key(key_id: str | None = None) -> str:
    """A fresh 'id:key' entry for AGENTFLOW_MASTER_KEYS."""
    key_id = key_id or f"mk{secrets.token_hex(4)}"
    return f"{key_id}:{b64encode(os.urandom(KEY_BYTES))}"


def current_master() -> MasterKey | None:
    keys = master_keys()
    return keys[0] if keys else None


def master_named(key_id: str) -> MasterKey:
    for key in master_keys():
        if key.id == key_id:
            return key
    raise MasterKeyError(
        f"master key {key_id!r} is not in AGENTFLOW_MASTER_KEYS: it wrapped keys still in "
        "use, so keep it listed until `agentflow_rotate_keys` has re-wrapped them"
    )


@lru_cache(maxsize=1024)
def _cipher(key: bytes) -> AESGCM:
    """One cipher object per key: building it costs more than sealing a short field."""
    return AESGCM(key)


def forget_ciphers() -> None:
    _cipher.cache_clear()


def seal(key: bytes, plaintext: bytes, aad: bytes) -> tuple[str, str]:
    """(nonce, ciphertext) as URL-safe base64; `aad` binds the ciphertext to where it is kept."""
    nonce = os.urandom(NONCE_BYTES)
    return b64encode(nonce), b64encode(_cipher(key).encrypt(nonce, plaintext, aad))


def unseal(key: bytes, nonce: str, ciphertext: str, aad: bytes) -> bytes:
    n, c = _b64decode(nonce), _b64decode(ciphertext)
    if n is None or c is None:
        raise MasterKeyError("a sealed value is damaged (not base64)")
    try:
        return _cipher(key).decrypt(n, c, aad)
    except InvalidTag:
        raise MasterKeyError(
            "a sealed value does not open with its key (damaged or moved)"
        ) from None


def b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _b64decode(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        return None
