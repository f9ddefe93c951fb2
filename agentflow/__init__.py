"""agentflow: crash-proof multi-step jobs and AI agents on Django, Celery and Postgres.

A reusable Django app: add "agentflow" to INSTALLED_APPS. Importing it does nothing else (no
settings, no Celery app, no logging); start runs with `agentflow.durable`.
"""
