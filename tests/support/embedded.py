"""The site's embedded default (`make run`: SQLite, and config.broker's filesystem transport)
is built on kombu 5.7's filesystem channel, as the site's dependency group says. A worker on an
older kombu (the Celery 5.5 and 5.6 legs of `make test-matrix`) cannot consume from it, so the
tests that start one there are skipped, saying why; the pinned stack always runs them."""

from __future__ import annotations

from importlib.metadata import version

import pytest
from packaging.version import Version

#: Marks a test that consumes from the embedded default's broker.
needs_embedded_broker = pytest.mark.skipif(
    Version(version("kombu")) < Version("5.7"),
    reason=f"the embedded default's broker (config.broker) needs kombu 5.7, not {version('kombu')}",
)
