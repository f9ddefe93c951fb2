"""Log lines leave without customer e-mail addresses or status-page ids."""

from __future__ import annotations

import io
import logging

from refunds.redaction import RedactPersonalData, mask

PUBLIC_ID = "rf_AbCdEfGhIjKlMnOpQrStUv"


def test_mask__addresses_plain_and_url_encoded() -> None:
    assert mask("mail to ana.lopez@example.com failed") == "mail to a***@e***.com failed"
    assert mask("GET /admin/?q=findme%40example.co.uk") == "GET /admin/?q=f***@e***.uk"
    assert "ana" not in mask("<Ana.Lopez@Example.COM>.")


def test_mask__status_page_ids_keep_four_characters() -> None:
    assert mask(f"GET /refunds/{PUBLIC_ID}/status.json") == "GET /refunds/rf_AbCd***/status.json"


def test_mask__leaves_run_ids_and_plain_text_alone() -> None:
    text = "wf_0123456789abcdef step 3 (charge_customer) failed: HTTP 500"
    assert mask(text) == text


def test_filter__masks_message_arguments_and_traceback() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactPersonalData())
    logger = logging.getLogger("tests.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("refund %s for %s", PUBLIC_ID, "ana@example.com")
        try:
            raise ValueError("refused ana@example.com")
        except ValueError:
            logger.exception("send failed")
    finally:
        logger.removeHandler(handler)
    written = stream.getvalue()
    assert "ana@example.com" not in written
    assert PUBLIC_ID not in written
    assert "refund rf_AbCd*** for a***@e***.com" in written
    assert "ValueError: refused a***@e***.com" in written


def test_settings__every_configured_handler_redacts() -> None:
    from django.conf import settings

    handlers = settings.LOGGING["handlers"]
    assert handlers and all("redact" in h.get("filters", []) for h in handlers.values())
    assert settings.LOGGING["loggers"]["gunicorn.access"]["handlers"] == ["console"]
    assert settings.CELERY_WORKER_HIJACK_ROOT_LOGGER is False
