"""tests/host: the files under project/ are copied into a fresh `startproject`, and scripts/
run in its venv; they are the host's code, not this suite's tests."""

from __future__ import annotations

import sys

import pytest

collect_ignore = ["project", "scripts"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How long each phase of the host's adoption took (build, install, run, ...)."""
    module = sys.modules.get("tests.host.test_host_project")
    phases: dict[str, float] = getattr(module, "PHASES", {})
    if not phases:
        return
    terminalreporter.section("tests/host phases")
    stack: dict[str, str] = getattr(module, "STACK", {})
    if stack:
        terminalreporter.write_line(", ".join(f"{name} {v}" for name, v in stack.items()))
    for name, seconds in phases.items():
        terminalreporter.write_line(f"{seconds:7.1f} s  {name}")
    # A phase run beside another ("... (beside ...)") is not added twice.
    total = sum(seconds for name, seconds in phases.items() if "(beside" not in name)
    terminalreporter.write_line(f"{total:7.1f} s  in all, one after the other")
