"""Named crash points for tests and demos (SPEC §3.6). Inert unless AGENTFLOW_FAULTS=1."""

from __future__ import annotations

import logging
import os
import signal
from datetime import timedelta
from typing import Any

from django.utils import timezone

logger = logging.getLogger(__name__)

#: Where a step can be made to crash (SPEC §3.6): its claim committed; its partner call
#: made, before the outcome is recorded; its completion committed, before the next message.
CRASH_POINTS = ("after_claim", "after_effect", "after_complete")


def enabled() -> bool:
    return os.environ.get("AGENTFLOW_FAULTS", "") in ("1", "true", "yes", "on")


def install_clock_offset(seconds: float) -> None:
    """Make this process's clock run `seconds` ahead (or behind), as on a host whose clock is
    off: Django's `timezone.now()` (auto_now fields, anything the code computes in Python) is
    shifted; the database's clock, which every engine decision uses, is not."""
    if not seconds or not enabled():
        return
    real_now = timezone.now

    def skewed_now() -> Any:
        return real_now() + timedelta(seconds=seconds)

    timezone.now = skewed_now  # type: ignore[assignment]
    logger.warning("fault injection: this process's clock runs %+.1f s off", seconds)


def crash_at_problem(value: str) -> str | None:
    """Why an AGENTFLOW_CRASH_AT value can never fire, or None. A misspelt point would
    otherwise do nothing, silently, and a crash test or demo would prove nothing."""
    if not value:
        return None
    step, _, point = value.rpartition(":")
    if not step or point not in CRASH_POINTS:
        points = ", ".join(CRASH_POINTS)
        return f"AGENTFLOW_CRASH_AT={value!r} is not STEP:POINT with POINT one of {points}"
    return None


def warn_if_crash_at_cannot_fire() -> None:
    problem = crash_at_problem(os.environ.get("AGENTFLOW_CRASH_AT", "")) if enabled() else None
    if problem:
        logger.error("fault injection: %s; no crash will happen", problem)


def crash_point(step: str, point: str, attempt: int) -> None:
    """SIGKILL this process at `step:point` on the step's first attempt.

    Read from the environment on every call so a test can aim it per worker process; the
    setting gate means a stray variable in production does nothing.
    """
    if not enabled():
        return
    if attempt != 1 or os.environ.get("AGENTFLOW_CRASH_AT", "") != f"{step}:{point}":
        return
    logger.warning("fault injection: SIGKILL at %s:%s (pid %s)", step, point, os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
