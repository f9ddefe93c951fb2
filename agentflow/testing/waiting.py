"""Polling with a deadline: tests wait for an observed event, never for a guessed sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> T:
    """Return the first truthy value of `predicate()`, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or predicate}")
        time.sleep(interval)
