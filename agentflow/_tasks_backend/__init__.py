"""Django's `django.tasks` framework served by agentflow runs (docs/tasks-backend.md).

What adopters name in `TASKS` is `agentflow.tasks_backend`; this package is how it works. Only
`resolver` may be imported where neither `django.tasks` (Django 6) nor the `django-tasks`
backport (Django 5.2) is installed: the engine loads it, the rest loads the framework.
"""
