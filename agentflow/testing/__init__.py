"""Tooling for test suites, bench and chaos: real worker, Redis and PostgreSQL processes on
demand (`processes`) and waiting on them (`waiting`).

Nothing in the engine's runtime imports this package (pyproject.toml's import contracts).
"""
