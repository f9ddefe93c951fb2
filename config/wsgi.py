"""WSGI entry point for gunicorn (`gunicorn config.wsgi`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

import django
from django.core.wsgi import get_wsgi_application
from django.utils.http import parse_header_parameters

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)

from config import tracing  # noqa: E402  (reads settings)

logger = logging.getLogger(__name__)


def unreadable_content_type_refused(app: Any) -> Any:
    """`app`, but a request whose Content-Type Django cannot read is answered 400 here.

    Django 5.2 reads the header while it builds the request, before any middleware or error
    handling, and a parameter in an encoding it does not know (`charset*=nope''x`) raises
    ValueError there: gunicorn would answer 500 and log a traceback, for any URL.
    """

    def guarded(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        try:
            parse_header_parameters(environ.get("CONTENT_TYPE", ""))
        except ValueError:
            path = str(environ.get("PATH_INFO", "")).encode("unicode_escape").decode("ascii")
            logger.warning("Bad Request (a Content-Type header it cannot read): %s", path)
            start_response("400 Bad Request", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"Bad Request: the Content-Type header cannot be read\n"]
        return app(environ, start_response)

    return guarded


tracing.configure()  # before the middleware loads: its request spans need the SDK in place
application = unreadable_content_type_refused(get_wsgi_application())
