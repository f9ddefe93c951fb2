"""`make test-matrix`: the engine's suite and the host project on every supported stack.

`make test` runs the whole suite on the pinned stack (the hashed lock); this runs what an
adopter's stack can change on the others, one leg per row of LEGS, on the machine's own
interpreters (never downloaded):
- `engine`: tests/agentflow in a venv of the leg's Python, with the leg's Django and Celery
  minor (each at its newest release) and the kombu minor that Celery minor was released with,
  everything else the newest the ranges allow (no lock: that is what an adopter resolves);
- `host`: tests/host, whose fresh project venv gets the leg's Python, the host's own Django
  and Celery, then the README's `pip install 'django-agentflow[redis]'` (CI runs these).
The Makefile gives both the suite's services and `-- <pytest args>` (the shards).
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent

nox.options.default_venv_backend = "uv"
nox.options.download_python = "never"  # the machine's interpreters, or the leg fails
nox.options.error_on_missing_interpreters = True  # a missing Python fails, never skips
nox.options.reuse_venv = "yes"  # each run's install brings a leg's venv to its requirements

#: (Python, Django, Celery, psycopg), each a minor: each Django on its newest Python (6.1 and
#: 5.2 on their oldest too), each Celery, the newest of everything and the oldest of each
#: (psycopg's floor there). Django 6.x needs Python >= 3.12.
LEGS = [
    ("3.13", "6.1", "5.7", "3.3"),  # the newest of each
    ("3.12", "6.1", "5.7", "3.3"),
    ("3.13", "6.0", "5.6", "3.3"),
    ("3.13", "5.2", "5.7", "3.3"),
    ("3.11", "5.2", "5.5", "3.2"),  # the oldest of each
]
IDS = [f"py{py}-django{django}-celery{celery}" for py, django, celery, _ in LEGS]


def stack(django: str, celery: str, psycopg: str) -> list[str]:
    """The leg's framework, a minor each at its newest release: Django, Celery and the kombu
    minor Celery was released with (Celery 5.6 alone would take kombu 5.7), psycopg."""
    return [
        f"django~={django}.0", f"celery~={celery}.0", f"kombu~={celery}.0",
        f"psycopg[binary]~={psycopg}.0",
    ]  # fmt: skip


@nox.session(tags=["engine"])
@nox.parametrize("python,django,celery,psycopg", LEGS, ids=IDS)
def engine(session: nox.Session, django: str, celery: str, psycopg: str) -> None:
    """tests/agentflow on the leg's stack."""
    extras = ",".join(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ])  # fmt: skip
    # The site's group asks for kombu 5.7 (`make run`'s broker): the leg's kombu overrides it,
    # with the redis extra that celery[redis] asks for (an override replaces every request).
    overrides = Path(session.create_tmp()) / "overrides.txt"
    overrides.write_text(f"kombu[redis]~={celery}.0\n")
    session.install(
        "--group", "test", "--override", str(overrides), "-e", f".[{extras}]",
        *stack(django, celery, psycopg),
    )  # fmt: skip
    session.run("python", "-c", VERSIONS)
    var = ROOT / "var" / "test" / "matrix" / session.name.replace("(", "-").rstrip(")")
    shutil.rmtree(var, ignore_errors=True)  # metric files and logs of an earlier run
    session.run(
        "pytest", "-p", "tests.support.shards", *session.posargs, "tests/agentflow",
        env={"AGENTFLOW_VAR_DIR": str(var)},
    )  # fmt: skip


@nox.session(python=False, tags=["host"])
@nox.parametrize("py,django,celery,psycopg", LEGS, ids=IDS)
def host(session: nox.Session, py: str, django: str, celery: str, psycopg: str) -> None:
    """tests/host, run from .venv: the project it builds is the leg's."""
    interpreter = shutil.which(f"python{py}")
    if interpreter is None:
        session.error(f"no python{py} on PATH (make test-matrix puts pyenv's there)")
    session.run(
        "pytest", "-p", "tests.support.shards", "tests/host",
        env={"HOST_PYTHON": interpreter, "HOST_STACK": " ".join(stack(django, celery, psycopg))},
    )  # fmt: skip


#: What a leg installed, printed before its tests.
VERSIONS = """
import sys
from importlib.metadata import version
names = ("django", "celery", "kombu", "redis", "psycopg")
print(f"Python {sys.version.split()[0]}", *(f"{n} {version(n)}" for n in names), sep=", ")
"""
