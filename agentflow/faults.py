"""Named crash points for tests and demos (SPEC §3.6). Inert unless AGENTFLOW_FAULTS=1."""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

logger = logging.getLogger(__name__)


def enabled() -> bool:
    return os.environ.get("AGENTFLOW_FAULTS", "") in ("1", "true", "yes", "on")


def install_clock_offset(seconds: float) -> None:
    """Make this process's clock run `seconds` ahead (or behind), as on a host whose clock is
    off: Django's `timezone.now()` (auto_now fields, anything the code computes in Python) is
    shifted; the database's clock, which every engine decision uses, is not."""
    if not seconds or not enabled():
        return
    from datetime import timedelta

    from django.utils import timezone

    real_now = timezone.now

    def skewed_now() -> Any:
        return real_now() + timedelta(seconds=seconds)

    timezone.now = skewed_now  # type: ignore[assignment]
    logger.warning("fault injection: this process's clock runs %+.1f s off", seconds)


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
