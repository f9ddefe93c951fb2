"""Model fallback: the model servers a turn may be answered by, in order, and the client that
asks them (`AGENTFLOW_LLM_FALLBACKS`, tried after `AGENTFLOW_LLM_BASE_URL`).

The chain runs inside one attempt of the turn's step, as Pydantic AI's `FallbackModel` runs
inside its durable request: the step's claim was committed before the first server was asked,
and its answer, whoever gave it, is what the checkpoint records (with the model and server
that gave it). A replay hands that record back and asks no server. The turn's fingerprint is
of the request (the primary's model, the messages, the tools), not of the server that happened
to answer, so a replay after the primary recovered still matches.

A server that fails (its connection refused, a timeout, a 5xx or 429, or a refusal of the
request) hands the turn to the next. The SDK's own retries are off (`openai_chat`): one try per
server per attempt; when every server failed, the step fails as the last retryable failure
(the engine retries the whole chain under the same key, with its back-off and its budget),
or, when none was retryable, permanently with every server's reason.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentflow._conf import settings
from agentflow.agent.conversation import ModelRequest, ModelResponse
from agentflow.exceptions import PermanentStepError, RetryableStepError

logger = logging.getLogger(__name__)

_KEYS = {"base_url", "model", "api_key"}


@dataclass(frozen=True, kw_only=True)
class ModelServer:
    """One entry of the chain: where to ask, which model, with which key."""

    base_url: str
    model: str
    api_key: str = ""


def fallback_servers(raw: Any = None) -> list[ModelServer]:
    """`AGENTFLOW_LLM_FALLBACKS` (a JSON text, or the same list in settings) as servers.

    Raises:
        ValueError: not a list of objects each with a `base_url` and a `model` (and at most an
            `api_key` besides), with what is wrong.
    """
    if raw is None:
        raw = settings.AGENTFLOW_LLM_FALLBACKS
    if isinstance(raw, str):
        if not raw.strip():
            return []
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc})") from exc
    if not isinstance(raw, list | tuple):
        raise ValueError("a JSON list of {base_url, model, api_key} objects")
    servers = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise ValueError(f"entry {index} is not an object")
        unknown = set(entry) - _KEYS
        if unknown:
            raise ValueError(f"entry {index} has unknown keys {sorted(unknown)}")
        for key in ("base_url", "model"):
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                raise ValueError(f"entry {index} needs a non-empty {key!r}")
        if not isinstance(entry.get("api_key", ""), str):
            raise ValueError(f"entry {index}'s 'api_key' is not a string")
        servers.append(
            ModelServer(
                base_url=entry["base_url"], model=entry["model"], api_key=entry.get("api_key", "")
            )
        )
    return servers


class FallbackModel:
    """A ModelClient that asks its clients in order until one answers (see the module).

    `model` and `provider` are the first client's: what the turn's fingerprint and its budget
    check name, whichever client answers."""

    def __init__(self, clients: Sequence[Any]) -> None:
        if not clients:
            raise ValueError("a fallback chain needs at least one client")
        self.clients = tuple(clients)
        self.model = self.clients[0].model
        self.provider = str(getattr(self.clients[0], "provider", "") or "")
        #: Every (model, provider) one attempt may ask: what its worst case adds up.
        self.chain = tuple(
            (client.model, str(getattr(client, "provider", "") or "")) for client in self.clients
        )

    def complete(self, request: ModelRequest) -> ModelResponse:
        failures: list[tuple[Any, Exception]] = []
        for client in self.clients:
            try:
                # Each server is asked for its own model; the conversation is the same.
                return client.complete(replace(request, model=client.model))
            except (RetryableStepError, PermanentStepError) as exc:
                failures.append((client, exc))
                logger.warning(
                    "model %s at %s failed (%s); %s",
                    client.model,
                    getattr(client, "base_url", "?"),
                    exc,
                    "trying the next" if len(failures) < len(self.clients) else "none left",
                )
        reasons = "; ".join(
            f"{client.model} at {getattr(client, 'base_url', '?')}: {exc}"
            for client, exc in failures
        )
        retryable = [exc for _, exc in failures if isinstance(exc, RetryableStepError)]
        if retryable:
            raise RetryableStepError(
                f"no model server answered ({reasons})",
                retry_after_seconds=retryable[-1].retry_after_seconds,
            ) from retryable[-1]
        raise PermanentStepError(f"every model server refused the request ({reasons})")
