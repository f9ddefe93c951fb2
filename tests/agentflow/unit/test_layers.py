"""The layers (issue 16): the import contracts in pyproject.toml hold, and what an import cannot
show is checked here: only `agentflow._store` writes engine rows, and no module imports one that
imports it back."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grimp
from django.apps import apps
from django.contrib import admin
from django.test import RequestFactory

ROOT = Path(__file__).resolve().parents[3]
#: The tooling and the commands: the one part of agentflow that may import the tooling.
TOOLING = {"testing", "management"}

#: ORM calls that write rows.
WRITES = {
    "create",
    "bulk_create",
    "bulk_update",
    "update",
    "delete",
    "get_or_create",
    "update_or_create",
    "save",
    "add",
    "remove",
    "clear",
    "set",
}
#: A raw statement that writes to an engine table, named in the SQL or a model's `db_table`.
RAW_WRITE = re.compile(
    r"\b(INSERT\s+INTO|UPDATE|DELETE\s+FROM|TRUNCATE)\s+(agentflow_|\{[^}]*\bdb_table\b)"
)


def test_the_import_contracts_hold() -> None:
    found = subprocess.run(
        [Path(sys.executable).parent / "lint-imports", "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert found.returncode == 0, found.stdout + found.stderr


def test_the_tooling_contract_names_every_runtime_module_of_agentflow() -> None:
    """Its source modules are listed (the commands are not among them), so a new module must
    join the list: else it could import the tooling unseen."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [contract] = [c for c in config["contracts"] if "the tooling" in c["name"]]
    package = ROOT / "agentflow"
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    packages = {p.parent.name for p in package.glob("*/__init__.py")}
    listed = {name.removeprefix("agentflow.") for name in contract["source_modules"]}
    assert listed == (modules | packages) - TOOLING


def test_the_domain_contract_forbids_every_private_module_of_agentflow() -> None:
    """The refund domain reaches agentflow only through its public modules: every private one
    is listed, so a new one cannot be imported from `refunds` unseen."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [contract] = [c for c in config["contracts"] if "public modules" in c["name"]]
    package = ROOT / "agentflow"
    names = {p.stem for p in package.glob("_*.py") if p.name != "__init__.py"}
    names |= {p.parent.name for p in package.glob("_*/__init__.py")}
    assert {name.removeprefix("agentflow.") for name in contract["forbidden_modules"]} == names


def test_a_hosts_migrations_name_only_public_paths() -> None:
    """A field agentflow offers deconstructs to its public name: a host's migrations (ours
    among them) would otherwise break when a private module moves."""
    from agentflow import durable

    _, path, _, _ = durable.PersonalTextField(subject="email").deconstruct()
    assert path == "agentflow.durable.PersonalTextField"
    migrations = (ROOT / "refunds" / "migrations").glob("*.py")
    assert not [m.name for m in migrations if "agentflow._" in m.read_text()]


#: Agent mode, and what may use it: the public API and what Django loads by name above it, the
#: tasks framework's runs, runs started from an agent's call.
AGENT_AND_ABOVE = {
    "agent",
    "durable",
    "_children",
    "_tasks_backend",
    "tasks_backend",
    "admin",
    "apps",
    "urls",
    "templatetags",
    "migrations",
    "webhooks",
    "middleware",
    "testing",
    "management",
}


def test_the_agent_contract_names_every_module_of_the_core() -> None:
    """Agent mode is a feature beside the core: every other module is listed as one that never
    imports it, so a new module of the core must join the list."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [contract] = [
        c for c in config["contracts"] if c.get("forbidden_modules") == ["agentflow.agent"]
    ]
    package = ROOT / "agentflow"
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    packages = {p.parent.name for p in package.glob("*/__init__.py")}
    listed = {name.removeprefix("agentflow.") for name in contract["source_modules"]}
    assert listed == (modules | packages) - AGENT_AND_ABOVE


def test_no_module_imports_one_that_imports_it_back() -> None:
    """As Python runs imports, function-level ones included: importing `agentflow._store.traces`
    runs `agentflow/_store/__init__.py` first, so it is an import of `agentflow._store` too (the
    circles that acyclic_siblings cannot see are a package and a module below it)."""
    graph = grimp.build_graph("agentflow", cache_dir=None)
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            for package in _packages_above(imported):
                if not importer.startswith(package + "."):
                    graph.add_import(importer=importer, imported=package)
    circles = sorted(
        f"{importer} -> {imported}"
        for importer in graph.modules
        for imported in graph.find_modules_directly_imported_by(importer)
        if not imported.startswith(importer + ".")  # a package runs its own modules' code first
        and importer in graph.find_upstream_modules(imported)
    )
    assert not circles, "each of these is imported back:\n" + "\n".join(circles)


def test_only_the_store_writes_engine_rows() -> None:
    """No ORM write on an engine model, its querysets or related managers, and no raw INSERT,
    UPDATE or DELETE, anywhere in the engine, the domain or the site but agentflow/_store (and a
    private feature package's `store.py`, and the bench's synthetic rows)."""
    engine = apps.get_app_config("agentflow")
    models = {model.__name__ for model in engine.get_models()}
    related = {
        rel.get_accessor_name()
        for model in engine.get_models()
        for rel in model._meta.related_objects
    }
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in _sources()
        for line, what in _writes(ast.parse(path.read_text()), models, related)
    ]
    assert not found, "engine rows written outside agentflow/_store:\n" + "\n".join(found)


def test_the_admin_console_adds_changes_and_deletes_no_engine_row() -> None:
    """Its pages and actions write through the store (retry, resume, cancel, fork); Django's own
    add, change and delete (and "delete selected") are off for every engine model."""
    request = RequestFactory().get("/admin/")
    request.user = SimpleNamespace(
        is_active=True, is_staff=True, is_superuser=True, has_perm=lambda *a, **k: True
    )
    engine = set(apps.get_app_config("agentflow").get_models())
    shown = [admin_ for model, admin_ in admin.site._registry.items() if model in engine]
    assert shown
    for model_admin in shown:
        assert not model_admin.has_add_permission(request)
        for inline in model_admin.get_inline_instances(request):
            assert not inline.has_add_permission(request, None)
        for each in (model_admin, *model_admin.get_inline_instances(request)):
            assert not each.has_change_permission(request, None)
            assert not each.has_delete_permission(request, None)
        assert "delete_selected" not in model_admin.get_actions(request)


def _packages_above(module: str) -> Iterator[str]:
    parts = module.split(".")
    for end in range(1, len(parts)):
        yield ".".join(parts[:end])


def _sources() -> Iterator[Path]:
    for package in ("agentflow", "refunds", "config"):
        for path in sorted((ROOT / package).rglob("*.py")):
            inside = path.relative_to(ROOT).parts
            if inside[:2] == ("agentflow", "_store") or "migrations" in inside:
                continue
            # The bench's bulk rows and yardsticks: tooling outside the wheel, no protocol run.
            if inside == ("config", "bench", "synthetic.py"):
                continue
            # A feature's own store part (agentflow/_schedules/store.py): the one writer of
            # that feature's rows, as agentflow/_store is of the core's.
            if inside[0] == "agentflow" and inside[1].startswith("_") and inside[-1] == "store.py":
                continue
            yield path


def _writes(tree: ast.Module, models: set[str], related: set[str]) -> Iterator[tuple[int, str]]:
    # Where a module holds engine models, a write on a plain name may be on one of their rows
    # or querysets: `run.save()`, `runs.delete()`, `runs.update(status=...)`. (A dict's update
    # takes a mapping, a client's delete takes keys: those are not these.)
    holds_models = any(
        isinstance(node, ast.ImportFrom) and node.module == "agentflow.models"
        for node in ast.walk(tree)
    )
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            method = node.func.attr
            if method not in WRITES:
                continue
            root, chain = _chain(node.func.value)
            on_model = isinstance(root, ast.Name) and root.id in models
            on_related = bool(related & set(chain))
            on_rows = (
                holds_models
                and isinstance(root, ast.Name)
                and root.id[:1].islower()
                and method in {"save", "delete", "update"}
                and not node.args
            )
            if on_model or on_related or on_rows:
                yield node.lineno, ast.unparse(node)[:100]
        elif isinstance(node, ast.Constant | ast.JoinedStr):
            text = ast.unparse(node) if isinstance(node, ast.JoinedStr) else node.value
            if isinstance(text, str) and RAW_WRITE.search(text):
                yield node.lineno, text[:100]


def _chain(node: ast.expr) -> tuple[ast.expr, list[str]]:
    """`WorkflowRun.objects.filter(...).first` -> (WorkflowRun, ["objects", "filter", "first"])."""
    names: list[str] = []
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return node, names[::-1]
