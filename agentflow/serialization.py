"""JSON checks for what the engine stores: inputs, step outputs and arguments."""

from __future__ import annotations

import json
from typing import Any


class NotJSONError(ValueError):
    pass


def to_json(value: Any, what: str) -> Any:
    """Round-trip `value` through JSON, so what is stored is exactly what a replay returns."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise NotJSONError(f"{what} is not JSON: {exc}") from None
