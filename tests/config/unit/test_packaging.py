"""The image and the install, read from their files: what goes in, from where, as whom.

There is no Docker engine here, so the image is proven by reading its recipe; the lock is
proven installable by `make test` itself, which installs from it (see docs/development.md).
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[3]


# --- .dockerignore ------------------------------------------------------------------------------
def _dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """Docker's matching: `**` any depth, `*` and `?` within one path part, from the root."""
    out, i = "", 0
    pattern = pattern.strip("/")
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out + r"(?:/.*)?\Z")  # a matched directory takes everything under it


def excluded(path: str) -> bool:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    result = False
    for line in (entry.strip() for entry in lines):
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if _dockerignore_regex(line.lstrip("!")).match(path):
            result = not negate
    return result


@pytest.mark.parametrize(
    "path",
    [
        "var/agentflow.sqlite3",
        "var/secret-key.txt",
        "var/admin-password.txt",
        "var/test/logs/worker.log",
        ".venv/bin/python",
        ".nox/engine-py3-13-django6-1-celery5-7/bin/python",
        ".git/HEAD",
        "agentflow/__pycache__/settings.cpython-311.pyc",
        "db.sqlite3",
        "refunds/sandbox/state.sqlite3",
        "gunicorn.log",
        "logs/worker.log",
        "celerybeat-schedule.db",
        ".env",
    ],
)
def test_dockerignore__leaves_state_secrets_and_tools_out(path: str) -> None:
    assert excluded(path)


@pytest.mark.parametrize(
    "path",
    [
        "manage.py",
        "pyproject.toml",
        "requirements.lock",
        "README.md",
        "config/settings.py",
        "refunds/sandbox/airline.py",
        "templates/base.html",
        "static/refunds/site.css",
    ],
)
def test_dockerignore__keeps_the_source(path: str) -> None:
    assert not excluded(path)


# --- Dockerfile ---------------------------------------------------------------------------------
def test_dockerfile__pinned_base_hashed_install_and_not_root() -> None:
    recipe = (ROOT / "Dockerfile").read_text()
    [base] = re.findall(r"^FROM (\S+)", recipe, re.M)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base
    assert "pip install --no-cache-dir --require-hashes --no-deps -r requirements.lock" in recipe
    assert "pip install --no-cache-dir --no-deps ." in recipe
    users = re.findall(r"^USER (\S+)", recipe, re.M)
    assert users and users[-1] not in ("root", "0")


# --- docker-compose.yml -------------------------------------------------------------------------
def test_compose__secrets_come_from_the_environment_and_redis_requires_a_password() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "DJANGO_SECRET_KEY: ${DJANGO_SECRET_KEY:?" in compose
    assert "POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?" in compose
    assert "postgres://agentflow:${POSTGRES_PASSWORD:?" in compose
    assert compose.count("redis://:${REDIS_PASSWORD:?") == 2  # broker and REDIS_URL
    assert '--requirepass \\"$$REDIS_PASSWORD\\"' in compose
    assert "REDISCLI_AUTH=" in compose  # the health check authenticates too
    assert "change-me" not in compose and "agentflow:agentflow@" not in compose
    for passthrough in ("DJANGO_HTTPS", "DJANGO_CSRF_TRUSTED_ORIGINS", "AGENTFLOW_TRUSTED_PROXIES"):
        assert f"{passthrough}: ${{{passthrough}:-" in compose


def test_compose__the_pgbouncer_profile_pools_the_app_and_leaves_liveness_direct() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    assert 'profiles: ["pgbouncer"]' in compose
    assert "@${POSTGRES_ADDRESS:-postgres:5432}/agentflow" in compose  # pooled when asked
    assert (
        "AGENTFLOW_LIVENESS_DATABASE_URL: postgres://agentflow:${POSTGRES_PASSWORD:?set "
        "POSTGRES_PASSWORD}@postgres:5432/agentflow" in compose
    )
    assert "required: false" in compose  # the app starts without the profile too
    ini = (ROOT / "config" / "pgbouncer.ini").read_text()
    for line in (
        "pool_mode = transaction",
        "max_prepared_statements = 200",
        "ignore_startup_parameters = extra_float_digits,options",
    ):
        assert line in ini


def test_compose__every_volume_the_app_writes_is_its_users() -> None:
    """The app runs as the image's user: a volume mounted where it writes must be that user's,
    or the first metric file (or the sandbox's state) fails to open. A named volume copies the
    image's directory and its owner; a tmpfs one starts as root's unless told otherwise."""
    recipe = (ROOT / "Dockerfile").read_text()
    compose = (ROOT / "docker-compose.yml").read_text()
    [uid] = re.findall(r"useradd .*--uid (\d+)", recipe)
    made = re.search(r"mkdir -p ([^\\&]+)", recipe)
    assert made is not None
    for directory in ("var/metrics", "var/sandbox"):
        assert directory in made.group(1).split(), f"the image must make {directory}"
    assert re.search(rf"type: tmpfs, device: tmpfs, o: \"uid={uid},gid={uid}", compose)


# --- the lock -----------------------------------------------------------------------------------
def pins(lock: str) -> dict[str, str]:
    text = (ROOT / lock).read_text()
    found = dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", text, re.M))
    return {canonicalize_name(name): version for name, version in found.items()}


def test_lock__every_pin_is_hashed() -> None:
    for lock in ("requirements.lock", "requirements-dev.lock"):
        entries = re.split(r"\n(?=[A-Za-z0-9])", (ROOT / lock).read_text())
        for entry in entries[1:]:
            assert "--hash=sha256:" in entry, f"{lock}: {entry.splitlines()[0]}"


def _group(groups: dict[str, list], name: str) -> list[str]:
    """A dependency group's requirements, its `include-group`s expanded (PEP 735)."""
    found: list[str] = []
    for entry in groups[name]:
        found += _group(groups, entry["include-group"]) if isinstance(entry, dict) else [entry]
    return found


def test_lock__pins_every_declared_dependency_within_its_range() -> None:
    """Fails when pyproject.toml gains or changes a dependency and `make lock` was not run."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project, groups = pyproject["project"], pyproject["dependency-groups"]
    runtime, dev = pins("requirements.lock"), pins("requirements-dev.lock")
    # The runtime lock is the engine with every extra and the site's group (what the image
    # installs); the dev lock adds the other groups (the bench's DBOS, the test and lint tools).
    engine = project["dependencies"] + [
        line for extra in project["optional-dependencies"].values() for line in extra
    ]
    declared = [(line, runtime) for line in engine + _group(groups, "site")]
    declared += [(line, dev) for line in _group(groups, "dev")]
    for line, locked in declared:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in locked, f"{name} is not in the lock: run `make lock`"
        assert requirement.specifier.contains(locked[name], prereleases=True), (name, line)
    assert all(dev[name] == version for name, version in runtime.items())


def test_wheel_metadata__publishes_only_what_an_adopter_may_install() -> None:
    """The repository's own needs are dependency groups, which no wheel carries: an extra
    named for them (site, bench, dev) would be offered to every adopter."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = set(pyproject["project"]["optional-dependencies"])
    assert extras == {"agent", "mcp", "prometheus", "otel", "redis", "tasks", "testing"}
    assert {"site", "bench", "test", "dev"} <= set(pyproject["dependency-groups"])


# --- the supported matrix -------------------------------------------------------------------
def _legs() -> list[tuple[str, str, str, str]]:
    """noxfile.py's LEGS, read without importing nox."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    [legs] = [
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [getattr(target, "id", None) for target in node.targets] == ["LEGS"]
    ]
    return legs


def _minors(classifiers: list[str], prefix: str) -> set[str]:
    return {c.removeprefix(prefix) for c in classifiers if re.fullmatch(rf"{prefix}\d+\.\d+", c)}


def test_matrix__ranges_and_classifiers_say_exactly_what_make_test_matrix_tests() -> None:
    """Each Python and Django the classifiers name is a leg of the matrix, and the ranges of
    Django and Celery end where the legs do: the minor past the newest and the one before the
    oldest are refused."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    legs = _legs()
    pythons, djangos, celeries, psycopgs = ({leg[i] for leg in legs} for i in range(4))
    classifiers = project["classifiers"]
    assert _minors(classifiers, "Programming Language :: Python :: ") == pythons
    assert _minors(classifiers, "Framework :: Django :: ") == djangos
    assert SpecifierSet(project["requires-python"]).contains(min(pythons, key=Version) + ".0")
    requirements = {Requirement(line).name: Requirement(line) for line in project["dependencies"]}
    for name, minors in (("django", djangos), ("celery", celeries), ("psycopg", psycopgs)):
        specifier = requirements[name].specifier
        assert all(specifier.contains(f"{minor}.99") for minor in minors), (name, specifier)
        major, minor = map(int, min(minors, key=Version).split("."))
        assert not specifier.contains(f"{major}.{minor - 1}.99"), (name, specifier)
        if name != "psycopg":  # its newer minors are Django's to refuse
            major, minor = map(int, max(minors, key=Version).split("."))
            assert not specifier.contains(f"{major}.{minor + 1}.0"), (name, specifier)
    # Django 6 needs Python 3.12: no leg asks for what pip would refuse.
    assert all(Version(leg[0]) >= Version("3.12") for leg in legs if leg[1] >= "6")
    # The newest of each, and the oldest of each, are legs.
    assert (
        tuple(max(minors, key=Version) for minors in (pythons, djangos, celeries, psycopgs)) in legs
    )
    assert (
        tuple(min(minors, key=Version) for minors in (pythons, djangos, celeries, psycopgs)) in legs
    )


def test_install__make_installs_from_the_hashed_lock_then_the_project_alone() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet --require-hashes --no-deps -r $(DEV_LOCK)" in makefile
    assert "pip install --quiet --no-deps -e ." in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text()
