"""The log formatter and the process kinds, as pure functions (no database)."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from agentflow import logs
from refunds.redaction import RedactPersonalData


@pytest.mark.parametrize(
    ("argv", "kind"),
    [
        (["/app/.venv/bin/gunicorn", "config.wsgi"], "web"),
        (["/usr/lib/python3/site-packages/gunicorn/__main__.py", "config.wsgi"], "web"),
        (["manage.py", "runserver"], "web"),
        (["/app/.venv/bin/celery", "-A", "config.celery_app", "worker", "-B"], "worker"),
        (["/x/celery/__main__.py", "-A", "config.celery_app", "beat", "-l", "info"], "beat"),
        (["manage.py", "sweep"], "sweep"),
    ],
)
def test_process_kind__from_the_command_line(argv: list[str], kind: str) -> None:
    assert logs.process_kind(argv) == kind


def _record(message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("agentflow.steps", logging.INFO, __file__, 1, message, args, None)


def test_json__one_object_with_the_bound_step_and_the_allowed_extras() -> None:
    record = _record("step %s took %.1f ms", "charge_customer", 12.34)
    record.duration_ms = 12.34
    record.password = "never"  # an extra nobody allowed stays out of the line
    with logs.bound(run_id="wf_1", seq=7, step="charge_customer", attempt=2):
        line = json.loads(logs.formatter("json").format(record))

    assert line["event"] == "step charge_customer took 12.3 ms"
    assert (line["run_id"], line["seq"], line["step"], line["attempt"]) == (
        "wf_1",
        7,
        "charge_customer",
        2,
    )
    assert line["duration_ms"] == 12.34 and "password" not in line
    assert line["level"] == "info" and line["logger"] == "agentflow.steps"
    assert {"timestamp", "process", "pid"} <= line.keys()


def test_json__unbound_after_the_block() -> None:
    with logs.bound(run_id="wf_1"):
        pass
    line = json.loads(logs.formatter("json").format(_record("idle")))
    assert "run_id" not in line


def test_json__a_traceback_without_local_variables() -> None:
    try:
        secret = "sk_live_do_not_log"
        raise ValueError(secret[:2])
    except ValueError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "boom", (), exc_info=sys.exc_info()
        )
    line = json.loads(logs.formatter("json").format(record))
    assert "sk_live_do_not_log" not in json.dumps(line)
    assert "ValueError: sk" in line["exception"]


def test_json__the_redaction_filter_masks_the_message_and_the_traceback() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.formatter("json"))
    handler.addFilter(RedactPersonalData())
    logger = logging.getLogger("tests.logs.redaction")
    logger.addHandler(handler)
    try:
        try:
            raise RuntimeError("no mailbox ana.lopez@example.com")
        except RuntimeError:
            logger.exception("mailing ana.lopez@example.com failed")
    finally:
        logger.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert "ana.lopez@example.com" not in stream.getvalue()
    assert line["event"] == "mailing a***@e***.com failed"
    assert "RuntimeError: no mailbox a***@e***.com" in line["exception"]


def test_text__a_readable_line_with_the_context() -> None:
    with logs.bound(run_id="wf_1"):
        line = logs.formatter("text").format(_record("run %s started", "wf_1"))
    assert "run wf_1 started" in line and "run_id=wf_1" in line and not line.startswith("{")


def test_config__rejects_an_unknown_format() -> None:
    with pytest.raises(ValueError, match="json or text"):
        logs.logging_config(format="xml", level="INFO")


def test_config__silences_celerys_per_task_and_per_tick_info_lines() -> None:
    loggers = logs.logging_config(format="json", level="INFO")["loggers"]
    for name in (
        "celery.worker.strategy",
        "celery.app.trace",
        "celery.beat",
        "stripe",
        "axes.apps",
    ):
        assert loggers[name]["level"] == "WARNING"


def _django_record(name: str, level: int, status: int) -> logging.LogRecord:
    try:
        raise ValueError("what Django caught")
    except ValueError:
        record = logging.LogRecord(
            name, level, __file__, 1, "Invalid HTTP_HOST header", (), exc_info=sys.exc_info()
        )
    record.status_code = status
    return record


@pytest.mark.parametrize(
    "name",
    ["django.security.DisallowedHost", "django.security.RequestDataTooBig", "django.request"],
)
def test_client_errors__a_request_django_answered_4xx__one_warning_line_without_a_traceback(
    name: str,
) -> None:
    record = _django_record(name, logging.ERROR, 400)

    assert logs.ClientErrors().filter(record)
    line = json.loads(logs.formatter("json").format(record))

    assert (line["level"], line["event"]) == ("warning", "Invalid HTTP_HOST header")
    assert "exception" not in line


@pytest.mark.parametrize(("name", "status"), [("django.request", 500), ("agentflow.runtime", 400)])
def test_client_errors__our_own_errors__keep_their_level_and_traceback(
    name: str, status: int
) -> None:
    record = _django_record(name, logging.ERROR, status)

    assert logs.ClientErrors().filter(record)
    line = json.loads(logs.formatter("json").format(record))

    assert line["level"] == "error" and "ValueError: what Django caught" in line["exception"]


def test_config__client_errors_before_the_sites_own_filters() -> None:
    config = logs.logging_config(
        format="json", level="INFO", filters={"redact": {"()": RedactPersonalData}}
    )

    assert config["handlers"]["console"]["filters"] == ["client_errors", "redact"]
    assert config["filters"]["client_errors"] == {"()": logs.ClientErrors}
