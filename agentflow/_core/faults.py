"""Named crash points for tests and demos (docs/protocol.md, "Crash points"). Inert unless
AGENTFLOW_FAULTS=1."""

from __future__ import annotations

import logging
import os
import signal
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.utils import timezone

logger = logging.getLogger("agentflow.faults")  # the name hosts' LOGGING knows

#: Where a step can be made to crash (docs/protocol.md, "Crash points"): its claim committed; its
#: partner call made, before the outcome is recorded; its completion committed, before the next
#: message.
CRASH_POINTS = ("after_claim", "after_effect", "after_complete")


#: Where a schedule's tick can be made to crash (`AGENTFLOW_CRASH_AT=schedule:slot_due`): the
#: slots due found and about to be recorded, nothing committed (docs/schedules.md).
SCHEDULE_CRASH_POINTS = ("slot_due",)


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
    if step == "schedule" and point in SCHEDULE_CRASH_POINTS:
        return None
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


def schedule_crash_point(point: str) -> None:
    """SIGKILL this process at `schedule:<point>` of a schedule's tick (a beat killed at the
    moment a slot becomes due), read from the environment as `crash_point` is."""
    if enabled() and os.environ.get("AGENTFLOW_CRASH_AT", "") == f"schedule:{point}":
        logger.warning("fault injection: SIGKILL at schedule:%s (pid %s)", point, os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)


def schedule_clock() -> datetime | None:
    """Tests only: the instant written in the file AGENTFLOW_SCHEDULE_CLOCK_FILE names, read on
    every tick, as the schedules' "now" (None: the database's clock). A test moves every
    process's schedules from slot to slot by rewriting it, rather than waiting for the minutes
    to pass; nothing else reads it (leases, the sweeper and runs keep the database's clock)."""
    path = os.environ.get("AGENTFLOW_SCHEDULE_CLOCK_FILE", "")
    if not path or not enabled():
        return None
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return datetime.fromisoformat(text) if text else None
