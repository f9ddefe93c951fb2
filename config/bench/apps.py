"""App config of the benchmark app."""

from __future__ import annotations

from django.apps import AppConfig


class BenchConfig(AppConfig):
    name = "config.bench"
    label = "agentflow_bench"
    verbose_name = "Workflow benchmark"
