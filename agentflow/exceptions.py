"""The engine's errors. Fields are plain values so they pickle across process boundaries."""

from __future__ import annotations


class AgentflowError(Exception):
    """An agentflow error."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class RetryableStepError(AgentflowError):
    """A transient failure: the step runs again later under the same idempotency key."""

    def __init__(self, message: str | None = None, *, retry_after_seconds: float | None = None):
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds

    def __reduce__(self):  # keep the keyword field when pickled
        return (_rebuild_retryable, (str(self), self.retry_after_seconds))


def _rebuild_retryable(message: str, retry_after_seconds: float | None) -> RetryableStepError:
    return RetryableStepError(message, retry_after_seconds=retry_after_seconds)


class PermanentStepError(AgentflowError):
    """A failure that retrying cannot fix: the run fails (and compensates)."""


class OutcomeUnknown(AgentflowError):
    """A reconcile could not tell whether the effect happened."""


class UnknownWorkflowError(AgentflowError):
    def __init__(self, name: str, known: list[str] | None = None) -> None:
        hint = f" (known: {', '.join(sorted(known))})" if known else ""
        super().__init__(f"no workflow named {name!r} is registered{hint}")
        self.name = name


class InvalidInputError(AgentflowError):
    """The workflow input is not JSON."""


class DefinitionError(AgentflowError):
    """A workflow definition is malformed."""
