"""The manual (docs/) builds as CI builds it, and the README's links into it lead somewhere.

Sphinx runs in a process of its own, as `make docs` runs it: with warnings as errors and every
internal link and reference checked (`-W --keep-going -n`), into a temporary directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from myst_parser.slugs import github_slugify

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"


def sphinx_build(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-W",
            "--keep-going",
            "-n",
            "-q",
            "-d",
            str(out / "doctrees"),
            str(source),
            str(out / "html"),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_docs__build_with_no_warning(tmp_path: Path) -> None:
    done = sphinx_build(DOCS, tmp_path)
    assert done.returncode == 0 and not done.stderr, done.stderr
    html = tmp_path / "html"
    api = (html / "api.html").read_text()
    documented = set(re.findall(r'id="(agentflow\.[\w.]+)"', api))
    wanted = {
        "agentflow.durable.start",
        "agentflow.durable.Workflow.step",
        "agentflow.testing.run_to_end",
        "agentflow.testing.crash_at",
        "agentflow.testing.assert_effects_once",
    }
    assert wanted <= documented, f"the API reference lacks {wanted - documented}"
    assert (html / "_images" / "admin-run.png").exists()  # the README's pictures, copied in


def test_docs__a_broken_link_or_reference_fails_the_build(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "guide").mkdir(parents=True)
    shutil.copy2(DOCS / "conf.py", source / "conf.py")
    (source / "index.md").write_text(
        "# Home\n\n```{toctree}\nguide/page\n```\n\n"
        "[a page](guide/missing.md) [a heading](guide/page.md#no-such-heading)\n"
    )
    (source / "guide" / "page.md").write_text(
        "# Page\n\n## A heading\n\n[here](#a-heading) {py:func}`agentflow.durable.no_such_call`\n"
    )
    done = sphinx_build(source, tmp_path / "out")
    assert done.returncode != 0
    assert "guide/missing.md" in done.stderr, done.stderr
    assert "no-such-heading" in done.stderr, done.stderr
    assert "agentflow.durable.no_such_call" in done.stderr, done.stderr
    assert "#a-heading" not in done.stderr  # a heading that exists resolves


def _anchors(page: Path) -> set[str]:
    """The anchors MyST gives the headings of a page (GitHub's slugs, as conf.py sets)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a `# comment` is no heading
    titles = re.findall(r"^#{1,6} (.+)$", text, re.M)
    return {github_slugify(re.sub(r"[`*]", "", title).strip()) for title in titles}


def test_readme__a_front_door_whose_links_into_the_docs_resolve() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 350, "the manual lives in docs/; the README is its door"
    links = re.findall(r"\]\((docs/[^)#]+)(?:#([^)]+))?\)", readme)
    assert links
    for path, anchor in links:
        page = ROOT / path
        assert page.is_file(), f"README links to {path}, which does not exist"
        if anchor:
            assert anchor in _anchors(page), f"README links to {path}#{anchor}: no such heading"
