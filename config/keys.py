"""The master key the embedded default makes for itself, so a demo's personal fields are sealed
too (docs/privacy.md, "Defaults"). Production sets AGENTFLOW_MASTER_KEYS from its secret store."""

from __future__ import annotations

import base64
import os
from pathlib import Path

#: Beside the database it protects only on a developer's machine: whoever copies var/ copies
#: both. Never used when AGENTFLOW_MASTER_KEYS is set.
FILE_NAME = "master-key.txt"


def local_master_key(var_dir: Path) -> str:
    """The 'id:key' entry kept in `var_dir`, made on first use (0600, by whichever process
    gets there first: the others read the same one)."""
    path = var_dir / FILE_NAME
    secret = base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("=")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(f"local:{secret}\n")
    for _ in range(100):  # the winner may not have written its line yet
        text = path.read_text().strip()
        if text:
            return text
    raise RuntimeError(f"{path} is empty: delete it and start again")
