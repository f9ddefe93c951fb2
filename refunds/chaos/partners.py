"""The partner sandbox's control API as the model-based test uses it: reset, faults, ledger."""

from __future__ import annotations

import json
import urllib.request
from typing import Any
from urllib.parse import urlencode


class Partners:
    """A client of one running sandbox (`manage.py sandbox`) at `url`."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def reset(self) -> None:
        """An empty ledger, no keys, no faults."""
        self._call("POST", "/_sandbox/reset")

    def fault(self, **spec: Any) -> None:
        """Arm one endpoint's fault (refunds/sandbox/faults.py says which fields)."""
        self._call("POST", "/_sandbox/faults", spec)

    def clear(self) -> None:
        self._call("DELETE", "/_sandbox/faults")

    def ledger(self, workflow_id: str | None = None) -> dict[str, Any]:
        query = f"?{urlencode({'workflow_id': workflow_id})}" if workflow_id is not None else ""
        return self._call("GET", f"/_sandbox/ledger{query}")

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")
