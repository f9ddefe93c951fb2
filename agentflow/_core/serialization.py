"""JSON checks for what the engine stores: inputs, step outputs and arguments."""

from __future__ import annotations

import json
import re
from typing import Any

#: Deeper JSON is refused: no real input, output or signal nests this far, and every reader of
#: a stored value (the replay, the admin's pages, Python's own json) recurses once per level.
MAX_DEPTH = 100
#: What Postgres cannot store in text or jsonb: NUL, and a lone surrogate (it has no UTF-8).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class NotJSONError(ValueError):
    pass


def to_json(value: Any, what: str) -> Any:
    """Round-trip `value` through JSON, so what is stored is exactly what a replay returns;
    refused (NotJSONError) unless every database the engine runs on can store it the same."""
    try:
        found = json.loads(json.dumps(value, allow_nan=False), parse_float=_exact_float)
    except (TypeError, ValueError) as exc:
        raise NotJSONError(f"{what} is not JSON: {exc}") from None
    except RecursionError:
        raise NotJSONError(f"{what} is nested deeper than {MAX_DEPTH} levels") from None
    problem = json_problem(found)
    if problem:
        raise NotJSONError(f"{what} {problem}")
    return found


def _exact_float(text: str) -> float | int:
    """A float that is a whole number past 2**53 becomes the integer it is exactly: Postgres
    keeps JSON numbers as decimals, so `6.530814087320323e+16` would come back as the integer
    its digits spell (65308140873203230), not the float (65308140873203232) that was sent."""
    number = float(text)
    return int(number) if number.is_integer() and abs(number) >= 2**53 else number


def json_problem(value: Any) -> str:
    """Why Postgres would refuse `value` (JSON as json.loads makes it), or "" if it would not:
    nested deeper than MAX_DEPTH, or a text (a key or a value) holding NUL or a lone surrogate.
    Iterative, so a deep value is measured rather than overflowing the stack."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, str):
            if not storable_text(item):
                return "holds a NUL character or a lone surrogate, which cannot be stored"
        elif isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                return f"is nested deeper than {MAX_DEPTH} levels"
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return ""


def storable_text(text: str) -> bool:
    """True if Postgres can store `text` as it is (no NUL, no lone surrogate)."""
    return _UNSTORABLE.search(text) is None
