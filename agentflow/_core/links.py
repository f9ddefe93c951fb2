"""Links from a run's admin page to the domain's own records, without the engine knowing them.

The engine never imports a domain, yet an operator looking at a run wants the record it serves
(the refund) and the partner's id of what a step made (the payment). So a domain registers,
per workflow, up to two small functions, usually in its `AppConfig.ready()`:

    durable.register_links("refund", run=refund_links, step=partner_links)

- `run(run: RunRef) -> Iterable[Link]` is called once per run page and may make a query.
- `step(run: RunRef, step: StepRef) -> Iterable[Link]` is called for every step shown and must
  not query: it reads the step's recorded output.

Both get read-only values, never engine rows. A function that raises is logged and shows no
links: a bug in a domain's link never costs the operator the page.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("agentflow.links")  # the name hosts' LOGGING knows


@dataclass(frozen=True, kw_only=True)
class Link:
    #: What the operator reads, e.g. `Refund rf_…` or `pi_3N…`.
    label: str
    url: str
    #: Where it leads, shown on hover (e.g. "Stripe dashboard").
    title: str = ""


@dataclass(frozen=True, kw_only=True)
class RunRef:
    id: str
    workflow: str
    version: int
    business_key: str | None
    input: Any
    status: str


@dataclass(frozen=True, kw_only=True)
class StepRef:
    seq: int
    name: str
    kind: str
    status: str
    output: Any


RunLinker = Callable[[RunRef], Iterable[Link]]
StepLinker = Callable[[RunRef, StepRef], Iterable[Link]]

_run_linkers: dict[str, RunLinker] = {}
_step_linkers: dict[str, StepLinker] = {}


def register(
    workflow: str, *, run: RunLinker | None = None, step: StepLinker | None = None
) -> None:
    """Give runs of `workflow` (every version) their links; registering again replaces them."""
    if run is not None:
        _run_linkers[workflow] = run
    if step is not None:
        _step_linkers[workflow] = step


def run_links(run: RunRef) -> list[Link]:
    linker = _run_linkers.get(run.workflow)
    return _call(linker, run) if linker is not None else []


def step_links(run: RunRef, step: StepRef) -> list[Link]:
    linker = _step_linkers.get(run.workflow)
    return _call(linker, run, step) if linker is not None else []


def _call(linker: Callable[..., Iterable[Link]], *args: Any) -> list[Link]:
    try:
        return [link for link in linker(*args) if isinstance(link, Link)]
    except Exception:
        logger.exception("links for %s failed; showing none", args[0].id)
        return []
