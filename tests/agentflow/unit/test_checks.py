"""`manage.py check` on the Celery settings the protocol stands on, read from the app in use."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import pytest
from celery import Celery, current_app
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from kombu import Queue

from agentflow._core import builds, dispatch
from agentflow._engine import checks
from agentflow.agent import checks as agent_checks


@contextmanager
def app_with(**conf: Any) -> Iterator[Celery]:
    previous = current_app._get_current_object()
    app = Celery("check-test", set_as_current=True)
    app.conf.update({"broker_url": "redis://127.0.0.1:6379/0", **conf})
    # Celery prefers CELERY_BROKER_URL from the environment (make test sets it) to the setting.
    env_url = os.environ.pop("CELERY_BROKER_URL", None)
    try:
        yield app
    finally:
        previous.set_current()
        if env_url is not None:
            os.environ["CELERY_BROKER_URL"] = env_url


def ids(**conf: Any) -> list[str]:
    with app_with(**conf):
        return [message.id for message in checks.celery_settings()]


def test_the_defaults_a_host_gets__raise_nothing() -> None:
    assert ids() == []


def test_acks_late_annotated_off_for_the_step_task__is_an_error() -> None:
    off = {dispatch.RUN_STEP_TASK: {"acks_late": False}}
    assert ids(task_annotations=off) == ["agentflow.E002"]
    assert ids(task_annotations=[{"*": {"reject_on_worker_lost": False}}]) == ["agentflow.E002"]


def test_eager_prefetch_and_a_time_limit_past_the_visibility_timeout__warn() -> None:
    assert ids(task_always_eager=True) == ["agentflow.W002"]
    assert ids(worker_prefetch_multiplier=4) == []  # 4 x 300 s is inside Redis's 3600 s
    assert ids(worker_prefetch_multiplier=12) == ["agentflow.W003"]
    assert ids(broker_transport_options={"visibility_timeout": 120}) == ["agentflow.W004"]
    late = {dispatch.RUN_STEP_TASK: {"time_limit": 7200}}
    assert ids(task_annotations=late) == ["agentflow.W004"]


def test_a_model_server_without_a_model__is_an_error() -> None:
    with override_settings(AGENTFLOW_LLM_BASE_URL="http://127.0.0.1:9/v1", AGENTFLOW_LLM_MODEL=""):
        assert [m.id for m in agent_checks.model_settings()] == ["agentflow.E001"]
    assert agent_checks.model_settings() == []


def test_rabbitmq__a_step_that_can_outlast_the_consumer_timeout__warns() -> None:
    rabbit = "amqp://guest:guest@127.0.0.1:5672//"
    assert ids(broker_url=rabbit) == []  # 300 s + 30 s inside RabbitMQ's default 1800 s
    assert ids(broker_url=rabbit, worker_prefetch_multiplier=6) == ["agentflow.W005"]
    late = {dispatch.RUN_STEP_TASK: {"time_limit": 3600}}
    assert ids(broker_url=rabbit, task_annotations=late) == ["agentflow.W005"]
    short = Queue("celery", queue_arguments={"x-consumer-timeout": 120_000})
    assert ids(broker_url=rabbit, task_queues=[short]) == ["agentflow.W005"]
    assert ids(broker_url=rabbit, task_queues=[Queue("celery")]) == []


def test_numeric_settings__the_defaults_pass__a_bad_value_is_an_error_naming_it() -> None:
    assert checks.numeric_settings() == []
    for name, bad in (
        ("AGENTFLOW_APPROVAL_TIMEOUT", 0),
        ("AGENTFLOW_APPROVAL_TIMEOUT", "48h"),
        ("AGENTFLOW_LEASE_SECONDS", -5),
        ("AGENTFLOW_LEASE_SECONDS", None),
        ("AGENTFLOW_MAX_ATTEMPTS", 2.5),
        ("AGENTFLOW_MAX_ATTEMPTS", True),
        ("AGENTFLOW_SWEEP_BATCH", "1000"),
        ("AGENTFLOW_RETENTION_DAYS", -1),
        ("AGENTFLOW_KEY_WINDOW_SECONDS", float("nan")),
        ("AGENTFLOW_AGENT_MAX_COST_USD", 0),
        ("AGENTFLOW_AGENT_MAX_COST_USD", "5"),
        ("AGENTFLOW_LLM_MAX_OUTPUT_TOKENS", 0),
    ):
        with override_settings(**{name: bad}):
            [message] = checks.numeric_settings()
            assert message.id == "agentflow.E003" and message.msg.startswith(name), (name, bad)
            assert repr(bad) in message.msg and "The default is" in (message.hint or "")
    for name, good in (
        ("AGENTFLOW_APPROVAL_TIMEOUT", 600),
        ("AGENTFLOW_RETENTION_DAYS", 0),
        ("AGENTFLOW_MAX_ATTEMPTS", 3.0),
        ("AGENTFLOW_CLOCK_OFFSET_SECONDS", -2.5),
        ("AGENTFLOW_AGENT_MAX_COST_USD", None),
        ("AGENTFLOW_AGENT_MAX_COST_USD", 0.5),
        ("AGENTFLOW_AGENT_MAX_COST_USD", Decimal("0.25")),
    ):
        with override_settings(**{name: good}):
            assert checks.numeric_settings() == [], (name, good)


@pytest.mark.parametrize("build", ["release/2026.12:rc 1 ü", "registry.test/app:2026.11 rc2 東京"])
def test_build_id__any_character_a_release_uses__passes(build: str) -> None:
    with override_settings(AGENTFLOW_BUILD_ID=build):
        assert checks.build_id() == []
        assert builds.current() == build


@pytest.mark.parametrize(
    ("build", "says"), [("v1\n", "U+000A"), ("b" * 101, "has 101"), ("v1 ", "space at an end")]
)
def test_build_id__one_no_column_holds__an_error_and_no_worker_starts(
    build: str, says: str
) -> None:
    with override_settings(AGENTFLOW_BUILD_ID=build):
        [error] = checks.build_id()
        assert error.id == "agentflow.E005" and says in error.msg
        with pytest.raises(ImproperlyConfigured, match="AGENTFLOW_BUILD_ID: a build id"):
            builds.current()


def test_webhook_secrets__slug_partners_with_secrets_pass__others_are_errors_saying_why() -> None:
    good = {"airline": ["whsec_new", "whsec_old"], "crm-eu_1": "whsec_c"}
    bad = {"crm:eu": "whsec", "openai/gpt-4o-mini": "whsec", "ok": [], "also_ok": 3}

    with override_settings(AGENTFLOW_WEBHOOK_SECRETS=good):
        assert checks.webhook_secrets() == []
    with override_settings(AGENTFLOW_WEBHOOK_SECRETS=bad):
        said = [(m.id, m.msg) for m in checks.webhook_secrets()]

    assert {id_ for id_, _ in said} == {"agentflow.E006"} and len(said) == 4
    assert "partner 'crm:eu' is no slug" in said[0][1]
    assert "partner 'openai/gpt-4o-mini' is no slug" in said[1][1]
    assert "['ok'] is a secret, or a list of them" in said[2][1]
