"""Log lines: JSON (or text for a terminal) through structlog, with the step being run bound.

Engine code logs through the standard library, under `agentflow.<module>` names (those of the
modules before they became private, so a host's LOGGING keeps working); structlog's
`ProcessorFormatter` renders every record, ours and Celery's and Django's, and merges the
context bound with `bind_step` into it. So one `grep wf_...` over the JSON lines of web,
worker and beat finds every line a run caused, each carrying its workflow, step, seq, attempt,
idempotency key and the owner process.
"""

from __future__ import annotations

import logging
import logging.config
import os
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

import structlog
from structlog.contextvars import bind_contextvars, bound_contextvars, reset_contextvars

FORMATS = ("json", "text")

#: Loggers whose INFO lines repeat for every step or every sweep tick and say nothing the
#: engine's own lines do not: Celery's "Task ... received" / "succeeded in", beat's "Sending
#: due task" every sweep interval, and the stripe library's two lines per request (the partner
#: call's span and the step line say it), and django-axes's "BEGIN version" at the start of
#: every process, management commands included. Their warnings and errors still show.
_CHATTY_LOGGERS = (
    "celery.worker.strategy",
    "celery.app.trace",
    "celery.beat",
    "stripe",
    "axes.apps",
)

#: Fields the engine passes as `extra=` that belong in the line (others stay out of it).
EXTRA_FIELDS = ("duration_ms", "events", "run_ids", "parked_run_ids", "query_ms")

#: The process kind every line carries: which of web, worker and beat wrote it.
_process = {"kind": ""}


def process_kind(argv: list[str] | None = None) -> str:
    """web, worker, beat, or the management command's name, from how this process started."""
    args = sys.argv if argv is None else argv
    # `python -m celery ...` shows up as .../celery/__main__.py
    path = args[0] if args else ""
    program = os.path.basename(path.removesuffix("/__main__.py"))
    if program == "gunicorn" or "runserver" in args:
        return "web"
    if program == "celery":
        for kind in ("worker", "beat"):
            if kind in args:
                return kind
        return "celery"
    if program == "manage.py" and len(args) > 1:
        return args[1]
    return program or "python"


def set_process_kind(kind: str) -> None:
    """For a process whose command line does not say what it is (the embedded beat of `-B`)."""
    _process["kind"] = kind


def _add_process(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    if not _process["kind"]:
        _process["kind"] = process_kind()
    event.setdefault("process", _process["kind"])
    event.setdefault("pid", os.getpid())
    return event


#: Left out of text lines, which are for a person at a terminal: the message already says the
#: duration, and the key and owner follow from run_id, seq and the process.
_TEXT_OMITS = ("pid", "duration_ms", "idempotency_key", "owner")


def _terse(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    for key in _TEXT_OMITS:
        event.pop(key, None)
    stamp = event.get("timestamp")
    if isinstance(stamp, str) and "T" in stamp:
        event["timestamp"] = stamp.split("T", 1)[1][:12]  # HH:MM:SS.mmm (UTC)
    return event


def _shared_processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.ExtraAdder(allow=EXTRA_FIELDS),
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _add_process,
    ]


def formatter(format: str) -> structlog.stdlib.ProcessorFormatter:
    """The formatter of every handler (referenced from settings.LOGGING by factory)."""
    if format == "json":
        renderer: list[Any] = [
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ]
    else:
        renderer = [_terse, structlog.dev.ConsoleRenderer(colors=False, pad_event_to=0)]
    return structlog.stdlib.ProcessorFormatter(
        # Before the formatter drops the record's traceback text: see _filtered_traceback.
        foreign_pre_chain=[*_shared_processors(), _filtered_traceback],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderer],
    )


def _filtered_traceback(_: Any, __: str, event: MutableMapping[str, Any]) -> Mapping[str, Any]:
    """A traceback as the handler's filters left it (`exc_text`: the redaction masks it there),
    never rendered again from the live exception, whose text the filters never saw."""
    record = event.get("_record")
    text = getattr(record, "exc_text", None)
    if text:
        event.pop("exc_info", None)
        event["exception"] = text
    return event


class ClientErrors(logging.Filter):
    """Django's line for a request it answers 4xx itself is one WARNING line, with no traceback.

    A Host not in ALLOWED_HOSTS, a body over DATA_UPLOAD_MAX_MEMORY_SIZE, too many fields or a
    body it cannot parse is the client's mistake, answered 400; Django logs it with the
    exception's traceback, at ERROR for the "suspicious" ones (`django.security.*`). Anyone on
    the internet can send those, so they would bury the errors that are ours.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if (
            record.name.startswith(_DJANGO_REQUEST_LOGGERS)
            and isinstance(status, int)
            and 400 <= status < 500
        ):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info, record.exc_text = None, None
        return True


_DJANGO_REQUEST_LOGGERS = ("django.request", "django.security.")


def logging_config(
    *,
    format: str,
    level: str,
    filters: dict[str, dict[str, Any]] | None = None,
    routed: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Django's LOGGING (also applied to Celery's processes by `configure`): one console
    handler with `ClientErrors` and every filter in `filters` (the project's redaction), and
    the `routed` loggers (that log nowhere by default, e.g. gunicorn's access log) sent to it."""
    if format not in FORMATS:
        raise ValueError(f"AGENTFLOW_LOG_FORMAT must be json or text, got {format!r}")
    loggers: dict[str, Any] = {name: {"level": "WARNING"} for name in _CHATTY_LOGGERS}
    loggers.update({name: {"handlers": ["console"], "propagate": False} for name in routed})
    every_filter = {"client_errors": {"()": ClientErrors}, **(filters or {})}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": every_filter,
        "formatters": {"structured": {"()": formatter, "format": format}},
        "handlers": {
            "console": {
                "class": "logging.StreamHandler",
                "formatter": "structured",
                # First: the redaction then masks what is left of the record.
                "filters": ["client_errors", *sorted(filters or {})],
            }
        },
        "root": {"handlers": ["console"], "level": level},
        "loggers": loggers,
    }


def configure(config: dict[str, Any]) -> None:
    """Apply the logging config; structlog's own loggers go through the same handlers."""
    logging.config.dictConfig(config)
    structlog.configure(
        processors=[
            *_shared_processors(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )


Tokens = Mapping[str, Any]


def bind(**context: Any) -> Tokens:
    """Bind fields to every line this thread logs until `unbind(tokens)`."""
    return bind_contextvars(**context)


def unbind(tokens: Tokens) -> None:
    reset_contextvars(**tokens)


@contextmanager
def bound(**context: Any) -> Iterator[None]:
    with bound_contextvars(**context):
        yield


@contextmanager
def quieted(name: str, level: int = logging.WARNING) -> Iterator[None]:
    """Raise one logger's level for a while (a command that would drown its own output)."""
    logger = logging.getLogger(name)
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)
