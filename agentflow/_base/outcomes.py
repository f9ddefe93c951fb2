"""Whether an effect may have happened (docs/protocol.md, "Unknown outcomes"): the one predicate
that cancel, fork, compensation plans, once-per-run guards and status pages ask, so none of them can
read "it did not answer" as "it did not happen".
"""

from __future__ import annotations

from typing import Protocol

from agentflow._base.states import StepKind, StepStatus


class Recorded(Protocol):
    """A step as recorded (a checkpoint, or a snapshot of one)."""

    @property
    def kind(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def retryable(self) -> bool: ...


def may_have_happened(*, kind: str, status: str, retryable: bool) -> bool:
    """An effect step that was ever claimed may have happened until its reconcile proves it did
    not or the partner refused it before anything could apply; both end it FAILED for good.

    COMPLETED: it happened (made, replayed or adopted). IN_PROGRESS, or FAILED and retryable (an
    answer lost, a timeout, a 5xx after the partner took it): it may have, and only asking the
    partner tells. A step of another kind changes nothing outside.
    """
    if kind != StepKind.EFFECT:
        return False
    return status != StepStatus.FAILED or retryable


def unsettled(*, kind: str, status: str, retryable: bool) -> bool:
    """It may have happened and nobody knows yet: the partner must be asked before anything
    builds on it (undo it, set it aside, or say "you have not been charged")."""
    return status != StepStatus.COMPLETED and may_have_happened(
        kind=kind, status=status, retryable=retryable
    )
