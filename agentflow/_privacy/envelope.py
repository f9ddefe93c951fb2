"""The stored form of a sealed value: an envelope JSON holds wherever the value was.

    {"$enc": "v1", "k": "sk_…", "n": "<nonce>", "c": "<AES-GCM ciphertext of the value's JSON>"}

`k` names the subject key; the version lets a later format sit beside this one. Opened, an
envelope is its value again, or ERASED once its key was destroyed.
"""

from __future__ import annotations

import json
from typing import Any

from agentflow._privacy import keys, keystore

VERSION = "v1"
#: What a personal field reads once its subject was erased, everywhere it is shown.
ERASED = "erased"
#: How an envelope starts as JSON text: a cheap test before any value is parsed or walked.
MARK = '"$enc"'


def seal_value(key_id: str, value: Any) -> Any:
    """`value` as an envelope under `key_id`; ERASED itself once that key was erased (a copy
    of an erased run's field, as a fork keeps, holds nothing left to seal)."""
    secret = keystore.data_key(key_id)
    if secret is None:
        return ERASED
    plaintext = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    nonce, ciphertext = keys.seal(secret, plaintext, _aad(key_id))
    return {"$enc": VERSION, "k": key_id, "n": nonce, "c": ciphertext}


def is_envelope(value: Any) -> bool:
    return isinstance(value, dict) and value.get("$enc") == VERSION and "k" in value


def open_value(value: Any) -> Any:
    """`value` with every envelope inside it opened (ERASED where its key is gone)."""
    if isinstance(value, list):
        return [open_value(item) for item in value]
    if not isinstance(value, dict):
        return value
    if is_envelope(value):
        return open_value(_open(value))
    return {key: open_value(item) for key, item in value.items()}


def maybe_sealed(text: str | bytes) -> bool:
    return MARK in text if isinstance(text, str) else MARK.encode() in text


def _open(envelope: dict[str, Any]) -> Any:
    key_id = str(envelope["k"])
    secret = keystore.data_key(key_id)
    if secret is None:
        return ERASED
    plaintext = keys.unseal(secret, str(envelope["n"]), str(envelope["c"]), _aad(key_id))
    return json.loads(plaintext)


def _aad(key_id: str) -> bytes:
    return f"agentflow-envelope-{VERSION}:{key_id}".encode()


def seal_text(key_id: str, text: str) -> str:
    """`text` sealed under key `key_id`, as the JSON text of its envelope (a text column)."""
    return json.dumps(seal_value(key_id, text))


def is_sealed_text(text: str) -> bool:
    return text.startswith("{") and MARK in text and is_envelope(_parsed(text))


def _parsed(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def open_text(text: str) -> str:
    """A text column's value: its envelope opened, or the text as it was stored."""
    if not text or not text.startswith("{") or MARK not in text:
        return text
    try:
        envelope = json.loads(text)
    except ValueError:
        return text
    if not is_envelope(envelope):
        return text
    opened = _open(envelope)
    return opened if isinstance(opened, str) else json.dumps(opened)
