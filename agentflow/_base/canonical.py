"""Canonical JSON: one text per JSON value, the same in every process and Python version.

Fingerprints compare a call made now with the call recorded before a crash, possibly by another
worker running another Python, and after the recorded value went through Postgres' `jsonb`. So
the text depends only on the value: keys sorted, no whitespace, no NaN or infinity, and numbers
written by value (`1.0` and `1` are the same JSON number, and `jsonb` may hand back either).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring, encode_basestring_ascii
from typing import Any

#: Integral numbers below this are written as exact integers (float or int alike); at and above
#: it they are written as doubles, as `jsonb` and JavaScript do (RFC 8785 uses the same bound).
_EXACT_INTEGER_LIMIT = 10**21


def _encoder(*, ascii: bool) -> Callable[[Any, int], Sequence[str]]:
    """Sorted keys, no whitespace, no NaN: the interpreter's C encoder, called directly (its
    chunks are the text). `JSONEncoder.encode` builds one on every call, with the cycle check:
    that costs as much as encoding a small message, and a replay encodes every message
    (`plain` has rejected a cycle already: it recurses as deep as one)."""
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:  # an interpreter without the C accelerator
        encoder = json.JSONEncoder(
            sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=ascii
        )
        return lambda value, _: (encoder.encode(value),)
    return c_make_encoder(  # type: ignore[no-any-return]
        None,  # no cycle check
        _not_json,
        encode_basestring_ascii if ascii else encode_basestring,
        None,  # no indent
        ":",
        ",",
        True,  # sort_keys
        False,  # skipkeys
        False,  # allow_nan
    )


def _not_json(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not a JSON value")


_ascii = _encoder(ascii=True)
_readable = _encoder(ascii=False)


class NotCanonicalError(ValueError):
    """A value with no canonical JSON form (a non-string key, NaN, a set, an object…)."""


def canonical_json(value: Any) -> str:
    """The canonical text of `value`: sorted keys, `,`/`:` separators, numbers by value.

    Non-ASCII characters are escaped (`\\u00e9`), so the text is plain ASCII and its bytes
    cannot depend on an encoding.

    Raises:
        NotCanonicalError: `value` is not made of dicts with string keys, lists, tuples,
            strings, finite numbers, booleans and None.
    """
    return "".join(_ascii(plain(value), 0))


def readable_json(value: Any) -> str:
    """Like `canonical_json`, but non-ASCII characters are kept as they are: for texts people
    and models read (a tool's result in a message)."""
    return "".join(_readable(plain(value), 0))


def unchanged(values: Sequence[Any], texts: Sequence[str]) -> bool:
    """Whether each of `values` still has the canonical text it had (`texts`): one encoding of
    them all, cheaper than `canonical_json` of each (no scan; one call). A value that was not
    already normal (an integral float) reads as changed."""
    try:
        return "".join(_ascii(values, 0)) == f"[{','.join(texts)}]"
    except (TypeError, ValueError):
        return False


def digest(value: Any) -> str:
    """SHA-256 of the canonical text, hex: a short, stable name for a value."""
    return hashlib.sha256(canonical_json(value).encode("ascii")).hexdigest()


def plain(value: Any) -> Any:
    """What `normalise` makes of `value` for writing it as JSON (tuples may stay tuples), and
    `value` itself, not a copy, when it already is: for texts made on every replay."""
    return value if _is_normal(value) else _normalise(value, "$")


def normalise(value: Any) -> Any:
    """`value` as the plain JSON value its canonical text stands for (tuples become lists,
    integral floats ints): what a later read of the stored value compares equal to."""
    return _normalise(value, "$")


def _is_normal(value: Any) -> bool:
    """True when `value` is already what `normalise` would make of it, up to tuples (which
    `json` writes as lists): a read-only scan, several times cheaper than building the copy,
    for the messages every replay hashes. Exact types only: a subclass (an enum member) takes
    the long way, which gives the same text."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return False
            if type(item) is not str and item is not None and not _is_normal(item):
                return False
        return True
    if kind is list or kind is tuple:
        for item in value:  # noqa: SIM110 (a loop: all() over a generator is slower here)
            if type(item) is not str and not _is_normal(item):
                return False
        return True
    if kind is int:
        return -_EXACT_INTEGER_LIMIT < value < _EXACT_INTEGER_LIMIT
    if kind is float:
        return math.isfinite(value) and not value.is_integer()
    return False


def _normalise(value: Any, path: str) -> Any:
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        if abs(value) < _EXACT_INTEGER_LIMIT:
            return value
        try:
            return _number(float(value), path)
        except OverflowError:
            raise NotCanonicalError(f"{path}: {value} is too large for a JSON number") from None
    if isinstance(value, float):
        return _number(value, path)
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise NotCanonicalError(f"{path}: object keys must be strings, got {key!r}")
        return {key: _normalise(item, f"{path}.{key}") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalise(item, f"{path}[{index}]") for index, item in enumerate(value)]
    raise NotCanonicalError(f"{path}: {type(value).__name__} is not a JSON value")


def _number(value: float, path: str) -> int | float:
    if not math.isfinite(value):
        raise NotCanonicalError(f"{path}: {value!r} is not a JSON number")
    if value.is_integer() and abs(value) < _EXACT_INTEGER_LIMIT:
        return int(value)  # 1.0 -> 1 and -0.0 -> 0: the same JSON number
    return value  # repr() is the shortest text that reads back as this double
