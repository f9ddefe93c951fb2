"""Named crash points for tests and demos (SPEC §3.6). Inert unless AGENTFLOW_FAULTS=1."""

from __future__ import annotations

import logging
import os
import signal

logger = logging.getLogger(__name__)


def crash_point(step: str, point: str, attempt: int) -> None:
    """SIGKILL this process at `step:point` on the step's first attempt.

    Read from the environment on every call so a test can aim it per worker process; the
    setting gate means a stray variable in production does nothing.
    """
    if os.environ.get("AGENTFLOW_FAULTS", "") not in ("1", "true", "yes", "on"):
        return
    if attempt != 1 or os.environ.get("AGENTFLOW_CRASH_AT", "") != f"{step}:{point}":
        return
    logger.warning("fault injection: SIGKILL at %s:%s (pid %s)", step, point, os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
