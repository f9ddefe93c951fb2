"""`manage.py bench` (docs/figures/bench.md): agentflow against a plain Celery chain and DBOS-style
yardsticks.

Opt-in: add "config.bench" to INSTALLED_APPS; its workflows and tasks
(`workload`) are then discovered through its `workflows` module, in web, worker and beat alike.
"""
