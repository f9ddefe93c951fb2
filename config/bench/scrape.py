"""What one /metrics scrape costs with the bench's finished history present
(docs/figures/bench.md)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from django.db import connection
from django.test import RequestFactory, override_settings

from agentflow._engine import views
from agentflow._observe import metrics

REPETITIONS = 7


@dataclass(frozen=True, kw_only=True)
class ScrapeFigure:
    #: Median of the whole view: token check, every process's metric files, three queries.
    scrape_ms: float
    scrape_ms_samples: list[float]
    #: The database's share: the two run queries' server time (EXPLAIN ANALYZE).
    queries_execution_ms: float
    uses_partial_indexes: bool
    metric_files: int
    plans: list[str]


def scrape_at_scale() -> ScrapeFigure:
    request = RequestFactory().get("/metrics")
    samples = []
    # The bench reads its own process's /metrics, whatever access the site configured.
    with override_settings(AGENTFLOW_METRICS_TOKEN="", AGENTFLOW_METRICS_PUBLIC=True):
        views.metrics(request)  # warm: imports, prepared plans
        for _ in range(REPETITIONS):
            started = time.perf_counter()
            response = views.metrics(request)
            samples.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.content[:200]
    plans = [
        query.explain(analyze=True)
        for query in (metrics.active_runs_query(), metrics.parked_runs_query())
    ]
    server_ms = sum(_execution_ms(plan) for plan in plans)
    return ScrapeFigure(
        scrape_ms=round(statistics.median(samples), 3),
        scrape_ms_samples=[round(ms, 3) for ms in samples],
        queries_execution_ms=round(server_ms, 3),
        uses_partial_indexes="run_sweep_due" in plans[0] and "run_needs_attention" in plans[1],
        metric_files=metrics.file_count(),
        plans=plans,
    )


def _execution_ms(plan: str) -> float:
    if connection.vendor != "postgresql":
        return 0.0
    for line in plan.splitlines():
        if line.startswith("Execution Time:"):
            return float(line.split()[2])
    return 0.0
