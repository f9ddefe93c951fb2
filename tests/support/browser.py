"""A real Chromium for page tests, and the worker + sandbox pair a live refund needs.

Fixtures:
- `page`: a fresh Chromium tab on pytest-django's live server (skipped without Chromium,
  failed under CI=true); a test fails if the tab broke the site's Content-Security-Policy.
- `running`: one real worker (two pool processes) doing steps against a clean partner sandbox.
`db(read)` runs a database read away from Playwright's event loop.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from django.db import connections

from agentflow.testing.waiting import wait_for
from tests.support.processes import Workers
from tests.support.sandbox import SandboxProcess

T = TypeVar("T")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
DESKTOP = {"width": 1280, "height": 900}


@pytest.fixture
def page(live_server: Any, settings: Any) -> Iterator[Any]:
    """A fresh Chromium tab on the live web app.

    Started after the database and server fixtures and closed before they are torn down:
    Playwright's sync API keeps an event loop in this thread, next to which Django refuses
    blocking database calls, such as creating or flushing the test database. The test's own
    reads go through `db()` for the same reason.
    """
    if not CHROMIUM.exists():
        reason = f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    settings.REFUNDS_SUBMIT_LIMIT = 0  # every submission here comes from 127.0.0.1
    settings.REFUNDS_BOOKING_LIMIT = 0  # and some send one booking several times
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            args=CHROMIUM_ARGS,
            # Playwright turns the back/forward cache off; a person's browser has it on, and it
            # is what brings back the very form (and token) that was sent.
            ignore_default_args=["--disable-back-forward-cache"],
        )
        refused: list[str] = []  # what the Content-Security-Policy blocked, as Chromium says it
        try:
            context = browser.new_context(viewport=DESKTOP, base_url=live_server.url)
            tab = context.new_page()
            tab.on("console", lambda message: _note_csp_refusal(message, refused))
            yield tab
        finally:
            browser.close()
    # The live server answers each kept-alive connection in a thread holding a database
    # connection until the socket closes; the test database cannot be flushed or dropped
    # while one is still winding down.
    wait_for(_no_request_threads, timeout=30, what="live server request threads to finish")
    assert refused == [], "the page broke its own Content-Security-Policy"


def _note_csp_refusal(message: Any, refused: list[str]) -> None:
    if "Content Security Policy" in message.text:
        refused.append(message.text)


def _no_request_threads() -> bool:
    return not any("process_request_thread" in t.name for t in threading.enumerate())


@pytest.fixture
def running(workers: Workers, clean_sandbox: SandboxProcess) -> Iterator[SandboxProcess]:
    """A real worker (two pool processes) doing the steps against the sandbox, with its embedded
    beat running the sweeper, as `make run` has it."""
    workers.start(
        concurrency=2,
        beat=True,
        SANDBOX_URL=clean_sandbox.url,
        SANDBOX_SMTP_PORT=str(clean_sandbox.smtp_port),
        STRIPE_API_BASE=clean_sandbox.url,
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=str(clean_sandbox.smtp_port),
    )
    yield clean_sandbox
    workers.kill_all()  # before the test database is flushed


def db(read: Callable[[], T]) -> T:
    """Run a database read in a thread of its own, away from Playwright's event loop (its
    context would get a connection of its own that nobody closes), closing it after."""

    def run() -> T:
        try:
            return read()
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()
