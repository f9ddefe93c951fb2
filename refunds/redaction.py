"""Logs carry no customer e-mail addresses and no status-page ids: both are masked on the way out.

A status-page id is the only key a customer holds to their request
(docs/refunds.md, "The status page"), so a log line with one is a log line that lets its reader see
the request; an address is personal data that an operator never needs in full to follow a run (the
run id does that).
"""

from __future__ import annotations

import logging
import re

_ADDRESS_CHARS = r"[^\s@<>()\[\],;:=&?/\"'%]"
_LABEL_CHARS = r"[^\s@<>()\[\],;:=&?/\"'%.]"
#: An address, also URL-encoded (`%40`) as in an access log's query string.
_EMAIL = re.compile(
    rf"(?P<local>{_ADDRESS_CHARS}+)(?:@|%40)(?P<domain>{_ADDRESS_CHARS}+\.{_LABEL_CHARS}+)"
)
#: Status-page ids (`rf_` + 22 URL-safe characters): the first four are kept to tell lines apart.
_PUBLIC_ID = re.compile(r"\brf_(?P<head>[A-Za-z0-9_-]{4})[A-Za-z0-9_-]{8,}")


def mask(text: str) -> str:
    """'ana.lopez@example.com' -> 'a***@e***.com'; 'rf_AbCd…' (22 chars) -> 'rf_AbCd***'."""
    text = _EMAIL.sub(_mask_email, text)
    return _PUBLIC_ID.sub(lambda m: f"rf_{m.group('head')}***", text)


def _mask_email(match: re.Match[str]) -> str:
    domain = match.group("domain")
    top = domain.rsplit(".", 1)[-1]
    return f"{match.group('local')[:1]}***@{domain[:1]}***.{top}"


class RedactPersonalData(logging.Filter):
    """A handler filter: rewrites each record's message (and traceback) with `mask`.

    On the handler, not a logger, so it sees records propagated from every library too
    (gunicorn's access log, axes, Celery). Always keeps the record.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string is the logging module's to report
            return True
        record.msg, record.args = mask(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = mask(record.exc_text)
        if record.stack_info:
            record.stack_info = mask(record.stack_info)
        return True
