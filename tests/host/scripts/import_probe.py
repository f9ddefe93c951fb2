"""Run by the fresh venv's Python in an empty directory: what importing agentflow changes in
the process (issue 16, contract item 2). Prints the changes as JSON; nothing changed is {}.

Besides `agentflow` itself, the modules a host's processes import before Django is set up
are probed too: the testing package and its pytest plugin (loaded into every pytest session
of a project that has agentflow installed).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import celery._state  # before: an app made by the import below would be counted


def _tree(root: Path) -> list[str]:
    return sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if "__pycache__" not in path.parts  # Python's own bytecode cache, not agentflow's
    )


def state() -> dict[str, Any]:
    from django.conf import settings

    loggers = {
        name: (logger.level, [repr(h) for h in logger.handlers], logger.propagate, logger.disabled)
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger) and (logger.handlers or logger.level)
    }
    return {
        "environ": dict(os.environ),
        "cwd": _tree(Path.cwd()),
        # The test gives the probe a temporary directory of its own (TMPDIR); only what could
        # be agentflow's is compared all the same.
        "tmp": sorted(
            name
            for name in os.listdir(tempfile.gettempdir())
            if any(word in name.lower() for word in ("agentflow", "prometheus", "celery"))
        ),
        "root handlers": [repr(h) for h in logging.root.handlers],
        "root level": logging.root.level,
        "handlers anywhere": len(logging._handlerList),  # type: ignore[attr-defined]
        "configured loggers": loggers,
        "celery apps": len(celery._state._apps),
        "celery default app": celery._state.default_app is not None,
        "django settings configured": settings.configured,
    }


def main() -> None:
    modules = sys.argv[1:] or ["agentflow"]
    before = state()
    for module in modules:
        importlib.import_module(module)
    after = state()
    changed = {
        key: {"before": before[key], "after": after[key]}
        for key in before
        if before[key] != after[key]
    }
    if "environ" in changed:  # only the variables that differ
        old, new = before["environ"], after["environ"]
        changed["environ"] = {
            k: (old.get(k), new.get(k)) for k in {*old, *new} if old.get(k) != new.get(k)
        }
    print(json.dumps({"imported": modules, "changed": changed}))


if __name__ == "__main__":
    main()
