"""Where a feature beside the core hooks into the core's own rounds (docs/layout.md, "Features
beside the core"): each sweeper pass, each retention tick, each scrape of /metrics. The core
runs what is registered here and imports no feature; each feature registers its parts from
`AgentflowConfig.ready()`, once per process, under its own name (registering again replaces).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any


@dataclass(frozen=True)
class Part:
    """One feature's part in a round: `run` does it; `what` names it in the round's log line (a
    sweep part: what failed, when it raises anything but the database being away, which ends
    the whole pass; a retention part: the rows it deleted)."""

    feature: str
    run: Callable[..., Any]
    what: str


_sweep: dict[str, Part] = {}
_retention: dict[str, Part] = {}
_gauges: dict[str, Callable[[], dict[str, Any]]] = {}


def on_sweep(feature: str, run: Callable[[], Any], *, failed: str) -> None:
    """`run()` in every sweeper pass, after the runs are rung, in the order registered."""
    _sweep[feature] = Part(feature, run, failed)


def on_retention(feature: str, run: Callable[[timedelta], int], *, rows: str) -> None:
    """`run(older_than)` in every retention tick, after the runs are purged: returns how many
    of its `rows` it deleted."""
    _retention[feature] = Part(feature, run, rows)


def on_scrape(feature: str, gauges: Callable[[], dict[str, Any]]) -> None:
    """`gauges()` on every scrape of /metrics: {metric name: {label values: value}}."""
    _gauges[feature] = gauges


def sweep_parts() -> tuple[Part, ...]:
    return tuple(_sweep.values())


def retention_parts() -> tuple[Part, ...]:
    return tuple(_retention.values())


def gauges() -> dict[str, Any]:
    """Every registered feature's gauges, merged."""
    merged: dict[str, Any] = {}
    for read in _gauges.values():
        merged.update(read())
    return merged
