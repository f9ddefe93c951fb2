"""Sphinx's configuration for agentflow's manual: Markdown pages (MyST), and the API reference
that autodoc reads from the docstrings of `agentflow.durable` and `agentflow.testing`.

`make docs` builds and serves it; tests/config/unit/test_docs.py builds it as CI does, with
warnings as errors and every internal link and reference checked (`-W --keep-going -n`).
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Any

import django
from sphinx.application import Sphinx
from sphinx.ext.napoleon import Config as NapoleonConfig
from sphinx.ext.napoleon.docstring import GoogleDocstring

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# autodoc imports the engine, whose models need Django set up. This site's settings refuse to
# load without a real secret key when DEBUG is off; the build signs nothing with it.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
django.setup()

project = "agentflow"
extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = "agentflow"

# Headings down to #### get anchors with GitHub's slugs, so `page.md#a-heading` works here and on
# GitHub alike, and a link to a page or heading that does not exist is a warning.
myst_heading_anchors = 4
myst_heading_slug_func = "github"
# Every reference must resolve (-n): a link into the API reference to a name it lacks fails.
nitpicky = True
# Standard-library types in signatures: without intersphinx (the build needs no network) they
# have nowhere to link. Named one by one, so any other unresolved reference still fails.
nitpick_ignore = [
    ("py:class", name)
    for name in (
        "collections.abc.Callable",
        "collections.abc.Iterable",
        "collections.abc.Iterator",
        "collections.abc.Mapping",
        "collections.abc.Sequence",
        "contextlib.AbstractContextManager",
        "datetime.datetime",
        "datetime.timedelta",
        "decimal.Decimal",
        "pathlib.Path",
        "random.Random",
        "types.EllipsisType",
    )
] + [
    # Engine types a public signature names but the public surface does not offer: a graph's
    # step definitions (Workflow.steps), and what may_have_happened reads (any step snapshot).
    ("py:class", "agentflow._core.registry.StepDef"),
    ("py:class", "agentflow._base.outcomes.Recorded"),
]

# Docstrings write `name` for code, as the Markdown pages do.
default_role = "literal"
autodoc_member_order = "bysource"
autodoc_typehints = "description"

# Google-style sections (Args:, Raises:, Returns:) become Sphinx fields, as napoleon makes them;
# but an attribute's `#:` comment is prose here, which napoleon would split at its first colon
# into a type and a description ("Parked for an operator: ..." read as a type).
_GOOGLE = NapoleonConfig(napoleon_numpy_docstring=False)


def _google_sections(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    if what in {"attribute", "data", "property"}:
        return
    lines[:] = GoogleDocstring(lines, _GOOGLE, app, what, name, obj, options).lines()


def setup(app: Sphinx) -> None:
    app.connect("autodoc-process-docstring", _google_sections)
