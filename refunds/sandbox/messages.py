"""The sandbox's request and response values, and the error shapes every partner answers with."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Request:
    """One parsed HTTP request; headers are keyed in lower case."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def json(self) -> Any:
        """The JSON body, or `Invalid` (400) when it is not a JSON object."""
        try:
            value = json.loads(self.body or b"{}")
        except ValueError:
            raise Invalid(partner_error(400, "invalid_json", "request body is not JSON")) from None
        if not isinstance(value, dict):
            raise Invalid(partner_error(400, "invalid_json", "request body must be a JSON object"))
        return value


@dataclass(frozen=True, kw_only=True)
class Response:
    """What to answer; `drop` means close the connection without answering (a fault)."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False

    def encode(self) -> bytes:
        return json.dumps(self.body, sort_keys=True).encode()


class Invalid(Exception):
    """A request rejected before execution: answered, never stored for its key (Stripe's rule)."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


def stripe_error(status: int, type_: str, message: str, **fields: Any) -> Response:
    """A Stripe-shaped error: `{"error": {"type", "message", ...}}`."""
    return Response(status=status, body={"error": {"type": type_, "message": message, **fields}})


def partner_error(status: int, code: str, message: str) -> Response:
    """An airline/CRM error: `{"error": code, "message": ...}`."""
    return Response(status=status, body={"error": code, "message": message})
