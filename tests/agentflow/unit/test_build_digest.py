"""A build's digest (docs/deploys.md, "Builds") is the same in every process of one code: a
`@task`'s workflow, defined only where its module was imported (a worker imports every app's
`tasks`, a web process may not), does not change it; any other definition does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentflow import durable
from agentflow._core import builds, registry
from agentflow._tasks_backend.resolver import PREFIX


@pytest.fixture
def defined() -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for workflow in made:
        registry.unregister(workflow)


def code_workflow(name: str) -> Any:
    return durable.CodeWorkflow(name, version=1, fn=lambda ctx: None)


def test_digest__a_task_defined_on_demand__leaves_it_unchanged(
    defined: list[Any], settings: Any
) -> None:
    settings.AGENTFLOW_BUILD_ID = ""
    before = builds.digest()

    defined.append(code_workflow(f"{PREFIX}orders.tasks.ship_later"))

    assert registry.on_demand(f"{PREFIX}orders.tasks.ship_later")
    assert builds.digest() == before == builds.current()


def test_digest__any_other_workflow_defined__changes_it(defined: list[Any], settings: Any) -> None:
    settings.AGENTFLOW_BUILD_ID = ""
    before = builds.digest()

    defined.append(code_workflow("orders_nightly"))

    assert not registry.on_demand("orders_nightly")
    assert builds.digest() != before
