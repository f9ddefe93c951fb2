"""A script's folder shadows nothing: `python folder/script.py` puts `folder` first on
`sys.path`, so a module there named like one of the standard library's is imported in its place
(`tests/support/calendar.py` once did so to `calendar`, which `email`, so pydantic, imports, and
the MCP test server died before it was listed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _script_folders() -> set[Path]:
    """The folders of the tracked scripts (the files that run as `__main__`)."""
    tracked = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return {
        (ROOT / name).parent
        for name in tracked
        if 'if __name__ == "__main__"' in (ROOT / name).read_text(encoding="utf-8")
    }


def test_no_script_folder_holds_a_module_named_like_the_standard_library_s() -> None:
    folders = _script_folders()
    assert ROOT / "tests" / "support" in folders  # the MCP test server is found
    shadows = sorted(
        str(path.relative_to(ROOT))
        for folder in folders
        for path in folder.iterdir()
        if (path.stem if path.suffix == ".py" else path.name) in sys.stdlib_module_names
        and (path.suffix == ".py" or (path / "__init__.py").exists())
    )
    assert shadows == []
