"""The middleware a host puts in MIDDLEWARE: `RequestSpanMiddleware`, first, a server span per
request so a run's trace starts at the request that started it (removed at start-up when
tracing is off); `DatabaseOutageMiddleware`, pages while the database does not answer: 503
with `Retry-After`, never the 500 page with a traceback per request (docs/operating.md, "When
the database is down").

With `agentflow.middleware.DatabaseOutageMiddleware` in MIDDLEWARE, a view (or the template it
renders) that finds the database unreachable answers an operator on an admin page that the
database is unreachable, and anyone else with the host's `503.html` (JSON to a client that asks
for JSON; plain text without the template). The process says so once in its log
(`agentflow._core.outage`), not once per request. Any other error is left to Django.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import TemplateDoesNotExist
from django.template.loader import render_to_string
from django.urls import Resolver404, resolve

from agentflow._core import outage
from agentflow._observe.tracing import RequestSpanMiddleware

__all__ = [
    "DatabaseOutageMiddleware",
    "RequestSpanMiddleware",
    "database_unreachable",
    "retry_later",
    "unavailable",
]

OPERATOR_TEMPLATE = "agentflow/database_unreachable.html"
CUSTOMER_TEMPLATE = "503.html"


class DatabaseOutageMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not database_unreachable(exception, "answering a page"):
            return None
        return unavailable(request)


def database_unreachable(exc: BaseException, doing: str) -> bool:
    """Is `exc` the database not answering (rather than an answer it gave)? If so, the process
    says so once in its log, naming what it was `doing`: for a view that answers an outage
    with a page of its own (the refund form keeps what the customer typed)."""
    if not outage.unreachable(exc):
        return False
    outage.noticed(exc, doing)
    return True


def retry_later(response: HttpResponse) -> HttpResponse:
    """`response` with the `Retry-After` an outage's 503 carries."""
    return outage.retry_later(response)


def unavailable(request: HttpRequest) -> HttpResponse:
    """The 503 for a page that needs the database while it does not answer. Rendered without
    the request: context processors would read the session, which lives in that database."""
    response: HttpResponse
    if _operator(request):
        body = render_to_string(OPERATOR_TEMPLATE, {"retry_after": outage.RETRY_AFTER_SECONDS})
        response = HttpResponse(body, status=503)
    elif request.accepts("application/json") and not request.accepts("text/html"):
        response = JsonResponse(
            {"error": "unavailable", "retry_after": outage.RETRY_AFTER_SECONDS}, status=503
        )
    else:
        try:
            response = HttpResponse(render_to_string(CUSTOMER_TEMPLATE), status=503)
        except TemplateDoesNotExist:
            response = HttpResponse(
                "Briefly unavailable: please try again in a minute.\n",
                status=503,
                content_type="text/plain; charset=utf-8",
            )
    return retry_later(response)


def _operator(request: HttpRequest) -> bool:
    """Is this an admin page? Its URL is in the admin's namespace (any AdminSite's)."""
    match = getattr(request, "resolver_match", None)
    if match is None:
        try:
            match = resolve(request.path_info)
        except Resolver404:
            return False
    return "admin" in match.app_names
