"""The site's worker under DEBUG does not keep the SQL of every statement its tasks ran."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.db import connection

from config.bench import workload
from config.celery_app import app


@pytest.mark.django_db
def test_task__starts_with_an_empty_query_log_under_debug(settings) -> None:
    settings.DEBUG = True  # Django now logs every statement until a request starts
    User.objects.exists()
    assert len(connection.queries) == 1

    app.tasks[workload.NOOP_TASK].apply()  # through Celery's tracer, as a worker runs it

    assert connection.queries == []
