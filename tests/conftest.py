"""Shared test set-up. Fixture modules live in tests/support and are listed here."""

from __future__ import annotations

pytest_plugins: list[str] = [
    "agentflow.testing.waiting",
    "tests.support.sandbox",
    "tests.support.processes",
    "tests.support.engine",
    "tests.support.llm_server",
    "tests.support.agent_workers",
    "tests.support.admin",
    "tests.support.browser",
    "tests.support.outage",
]
