"""WSGI entry point for gunicorn (`gunicorn config.wsgi`)."""

from __future__ import annotations

import os

import django
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)

from config import tracing  # noqa: E402  (reads settings)

tracing.configure()  # before the middleware loads: its request spans need the SDK in place
application = get_wsgi_application()
