"""Any OpenAI-compatible chat-completions server, through the official `openai` SDK.

The SDK's own retries are off: a model turn is a step, and the engine retries the step (under
the same key, with its back-off and its budget) so that every attempt is counted and a crash
between two SDK-internal retries cannot hide one. Errors leave here as the engine's:
timeouts, connection errors, 408/409/429 and 5xx are retryable (Retry-After honoured), other
4xx are permanent with a reason an operator can act on.
"""

from __future__ import annotations

import email.utils
import math
import time
from functools import lru_cache
from typing import Any

import openai

from agentflow._conf import settings
from agentflow.agent.conversation import (
    OPENAI_PROVIDER,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)
from agentflow.agent.conversation import assistant_message as _assistant_message
from agentflow.exceptions import (
    PartnerRateLimited,
    PartnerUnavailable,
    PermanentStepError,
    RetryableStepError,
)

#: Opening a connection should be quick even to a busy server; a slow one is retried.
CONNECT_TIMEOUT_SECONDS = 5.0
#: Local servers (vLLM, llama.cpp, Ollama) take any key, but the SDK insists on one.
_NO_KEY = "unused"
#: A server's error text is quoted in the run's error up to this length.
_MAX_REASON_CHARS = 300
_RETRYABLE_STATUSES = (408, 409, 429)


@lru_cache(maxsize=8)
def _sdk_client(base_url: str, api_key: str, timeout_seconds: float) -> openai.OpenAI:
    """One SDK client (and connection pool) per configuration and process."""
    return openai.OpenAI(
        base_url=base_url,
        api_key=api_key or _NO_KEY,
        max_retries=0,
        timeout=openai.Timeout(
            timeout_seconds, connect=min(CONNECT_TIMEOUT_SECONDS, timeout_seconds)
        ),
    )


class OpenAIChatModel:
    """A ModelClient for a chat-completions endpoint with tool calling (non-streaming)."""

    #: Whose prices its models have (genai-prices' provider id; OpenTelemetry's name too).
    provider = OPENAI_PROVIDER

    def __init__(
        self, *, base_url: str, model: str, api_key: str = "", timeout_seconds: float = 60.0
    ) -> None:
        self.base_url = base_url
        self.model = model
        self.timeout_seconds = timeout_seconds
        self._client = _sdk_client(base_url, api_key, timeout_seconds)

    @classmethod
    def from_settings(cls) -> OpenAIChatModel:
        return cls(
            base_url=settings.AGENTFLOW_LLM_BASE_URL,
            model=settings.AGENTFLOW_LLM_MODEL,
            api_key=settings.AGENTFLOW_LLM_API_KEY,
            timeout_seconds=settings.AGENTFLOW_LLM_TIMEOUT_SECONDS,
        )

    def complete(self, request: ModelRequest) -> ModelResponse:
        options: dict[str, Any] = {"tools": list(request.tools)} if request.tools else {}
        if request.max_tokens:
            options["max_tokens"] = request.max_tokens
        # Our messages are the SDK's message params as plain dicts (the JSON we checkpoint).
        messages: Any = list(request.messages)
        try:
            completion = self._client.chat.completions.create(
                model=request.model, messages=messages, **options
            )
        except openai.APITimeoutError as exc:
            raise PartnerUnavailable(
                f"the model server at {self.base_url} did not answer within "
                f"{self.timeout_seconds:g} s"
            ) from exc
        except openai.APIConnectionError as exc:
            raise PartnerUnavailable(
                f"could not reach the model server at {self.base_url}: {_cause(exc)}"
            ) from exc
        except openai.APIStatusError as exc:
            raise self._status_error(exc, request.model) from exc
        except openai.APIResponseValidationError as exc:
            raise RetryableStepError(
                f"the model server at {self.base_url} sent an answer we could not read"
            ) from exc
        return self._response(completion)

    def _status_error(
        self, exc: openai.APIStatusError, model: str
    ) -> RetryableStepError | PermanentStepError:
        status = exc.status_code
        reason = _reason(exc)
        if status == 429:
            # The provider's own limit (x-ratelimit-*, retry-after): an answer, not a lost one.
            return PartnerRateLimited.from_headers(
                f"the model server answered HTTP 429: {reason}", exc.response.headers
            )
        if status >= 500:
            return PartnerUnavailable(
                f"the model server answered HTTP {status}: {reason}",
                retry_after_seconds=retry_after_seconds(exc.response.headers),
            )
        if status in _RETRYABLE_STATUSES:
            return RetryableStepError(
                f"the model server answered HTTP {status}: {reason}",
                retry_after_seconds=retry_after_seconds(exc.response.headers),
            )
        if status == 401:
            return PermanentStepError(
                f"the model server at {self.base_url} rejected our credentials (HTTP 401: "
                f"{reason}); check AGENTFLOW_LLM_API_KEY"
            )
        if status == 403:
            return PermanentStepError(
                f"the model server refused access to model {model!r} (HTTP 403: {reason})"
            )
        if status == 404:
            return PermanentStepError(
                f"the model server at {self.base_url} has no model {model!r} or no "
                f"chat-completions endpoint (HTTP 404: {reason}); check AGENTFLOW_LLM_MODEL "
                "and AGENTFLOW_LLM_BASE_URL"
            )
        return PermanentStepError(f"the model server refused the request (HTTP {status}: {reason})")

    def _response(self, completion: Any) -> ModelResponse:
        if not completion.choices:
            raise RetryableStepError(f"the model server at {self.base_url} answered no choices")
        choice = completion.choices[0]
        calls = []
        for part in choice.message.tool_calls or ():
            if part.type != "function":
                raise PermanentStepError(
                    f"the model answered with a {part.type!r} tool call; only functions are offered"
                )
            calls.append(
                ToolCall(
                    id=part.id, name=part.function.name, arguments_text=part.function.arguments
                )
            )
        message = _assistant_message(choice.message.content, tuple(calls))
        if choice.message.refusal:
            message["refusal"] = choice.message.refusal
        usage = completion.usage
        return ModelResponse(
            message=message,
            finish_reason=choice.finish_reason or "stop",
            usage=Usage.from_json(usage.model_dump() if usage is not None else None),
            model=completion.model or self.model,
            provider=OPENAI_PROVIDER,
            server=self.base_url,
        )


def retry_after_seconds(headers: Any, *, now: float | None = None) -> float | None:
    """The server's requested wait: `retry-after-ms`, `Retry-After` in seconds or as an HTTP
    date. None when absent or unreadable; never negative, never infinite (the engine also
    clamps it to its own maximum)."""
    if not headers:
        return None
    milliseconds = _number(headers.get("retry-after-ms"))
    if milliseconds is not None:
        return milliseconds / 1000
    raw = headers.get("retry-after")
    seconds = _number(raw)
    if seconds is not None:
        return seconds
    if raw:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        return max(0.0, when.timestamp() - (time.time() if now is None else now))
    return None


def _number(raw: Any) -> float | None:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _reason(exc: openai.APIStatusError) -> str:
    body = exc.body
    message = body.get("message") if isinstance(body, dict) else None
    text = str(message or exc.message or exc.response.reason_phrase)
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 1] + "…"


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return f"{type(cause).__name__}: {cause}" if cause else str(exc)
