"""What the code cites is in the repository: the manual's pages and sections, nothing outside.

Comments and docstrings explain a rule by pointing at the page of `docs/` that states it, by
page and heading (`docs/protocol.md, "Unknown outcomes"`). A heading renamed or a page moved
would leave such a pointer leading nowhere, and a pointer to a document the repository does not
hold (the product brief the project began from, a research note, an article) cannot be followed
by the next engineer at all. Both are checked here over every tracked text file.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from myst_parser.slugs import github_slugify

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
TEXT_FILES = {".py", ".md", ".html", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml"}

#: Pointers at documents outside the repository. Written so that this file does not match them
#: itself: the brief's name, a section sign, and the notes and article it drew on.
OUTSIDE = re.compile(
    r"\bS[P]EC\b|\u00a7|\b[Tt]he[ ]spec\b|\bspec's\b|seed[ ]article|\b[Tt]he[ ]article's\b"
    r"|facts[ ]file|research[ ]file|/work/[s]hared"
)
#: `docs/<page>.md`, optionally `#anchor`, then any `, "<Heading>"` (or `'<Heading>'`).
CITATION = re.compile(
    r"""(?<![\w/.-])docs/(?P<page>[\w./-]+\.md)(?:\#(?P<anchor>[\w-]+))?"""
    r"""(?P<headings>(?:,[ ](?P<q>["'])[^"'\n]+(?P=q))*)"""
)


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return sorted(
        ROOT / name
        for name in listed.split("\0")
        if name and Path(name).suffix in TEXT_FILES and (ROOT / name).is_file()
    )


def headings(page: Path) -> list[str]:
    """The page's headings, as written (fenced code is not a heading)."""
    found, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+?)\s*$", line)):
            found.append(m.group(1))
    return found


def citations(path: Path) -> list[tuple[int, str, str | None, list[str]]]:
    """(line, page, anchor, headings) of every `docs/...` citation in the file."""
    found = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in CITATION.finditer(line):
            named = re.findall(r""", (["'])([^"'\n]+)\1""", m.group("headings"))
            found.append((n, m.group("page"), m.group("anchor"), [h for _, h in named]))
    return found


def test_citations__nothing_points_outside_the_repository() -> None:
    outside = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in tracked_text_files()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not outside, "cite the page of docs/ that holds it instead:\n" + "\n".join(outside)


def test_citations__every_cited_page_and_heading_exists() -> None:
    broken = []
    for path in tracked_text_files():
        for n, page, anchor, named in citations(path):
            where = f"{path.relative_to(ROOT)}:{n}: docs/{page}"
            if not (DOCS / page).is_file():
                broken.append(f"{where}: no such page")
                continue
            titles = headings(DOCS / page)
            broken += [f'{where}: no heading "{h}"' for h in named if h not in titles]
            if anchor and anchor not in {github_slugify(t) for t in titles}:
                broken.append(f"{where}#{anchor}: no such heading")
    assert not broken, "\n".join(broken)


def test_citations__the_patterns_find_what_they_guard_against() -> None:
    assert OUTSIDE.search("as SP" + "EC 3.9 says") and OUTSIDE.search("(\u00a73.3b)")
    assert not OUTSIDE.search("ArgumentSpec, a WaitSpec's spec, docs/protocol.md")
    line = """x (docs/protocol.md, "Unknown outcomes", "I8: money"; docs/agent.md) y"""
    found = [(m.group("page"), m.group("headings")) for m in CITATION.finditer(line)]
    assert found == [("protocol.md", ', "Unknown outcomes", "I8: money"'), ("agent.md", "")]
