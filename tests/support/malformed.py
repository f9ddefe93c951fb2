"""What the malformed-input tests share: the suite's Hypothesis budget, the log lines a request
or a command wrote (a refusal is one WARNING line, never a traceback), a command's refusal."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from hypothesis import HealthCheck, settings

#: Small and deterministic: derandomized (the same examples every run), no example database,
#: no deadline (the machine is shared). A few seconds a test.
BUDGET = settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class Lines(logging.Handler):
    """The records at WARNING and above that reach the root logger's handlers."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def tracebacks_or_errors(self) -> list[str]:
        return [
            f"{r.levelname} {r.name}: {r.getMessage()[:200]}"
            for r in self.records
            if r.exc_info or r.exc_text or r.levelno > logging.WARNING
        ]


@contextmanager
def logged() -> Iterator[Lines]:
    lines = Lines()
    root = logging.getLogger()
    root.addHandler(lines)
    try:
        yield lines
    finally:
        root.removeHandler(lines)


def refusal(command: str, *args: str) -> str:
    """The line `command` refuses `args` with (its CommandError, as a shell prints it after
    "CommandError: "), checked to be one line, with nothing logged above WARNING."""
    with logged() as lines, pytest.raises(CommandError) as refused:
        call_command(command, *args, stdout=StringIO(), stderr=StringIO())
    assert lines.tracebacks_or_errors() == []
    said = str(refused.value)
    assert "\n" not in said, said
    return said
