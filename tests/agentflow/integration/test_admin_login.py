"""Admin logins through the real login form: attempts are limited per client address (axes)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.test import Client, override_settings
from django.utils import timezone

pytestmark = pytest.mark.django_db

LOGIN = "/admin/login/?next=/admin/"
PASSWORD = "a-long-operator-passphrase"


@pytest.fixture(autouse=True)
def operator() -> None:
    get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)


def log_in(password: str, *, ip: str = "203.0.113.5", **meta: str):
    client = Client()
    response = client.post(LOGIN, {"username": "ops", "password": password}, REMOTE_ADDR=ip, **meta)
    return response, client


def logged_in(response, client: Client) -> bool:
    return response.status_code == 302 and client.get("/admin/").status_code == 200


def test_login__the_right_password_logs_in() -> None:
    assert logged_in(*log_in(PASSWORD))


def test_login__a_success_after_a_few_mistakes_is_not_blocked_and_clears_them() -> None:
    for _ in range(4):
        assert log_in("wrong")[0].status_code == 200  # the form again, with its error
    assert logged_in(*log_in(PASSWORD))
    for _ in range(4):
        log_in("wrong")
    assert logged_in(*log_in(PASSWORD))  # the earlier four no longer count


def test_login__fifth_failure_locks_the_address_out_even_with_the_right_password() -> None:
    for _ in range(5):
        log_in("wrong")
    response, client = log_in(PASSWORD)
    assert response.status_code == 429
    assert "Too many login attempts" in response.content.decode()
    assert "Traceback" not in response.content.decode()
    assert client.get("/admin/").status_code == 302  # still not logged in


def test_login__a_locked_out_address_does_not_lock_out_the_operator_elsewhere() -> None:
    for _ in range(5):
        log_in("wrong", ip="198.51.100.66")
    assert logged_in(*log_in(PASSWORD, ip="203.0.113.5"))


def test_login__lockout_ends_after_the_cool_off() -> None:
    for _ in range(5):
        log_in("wrong")
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))
    assert logged_in(*log_in(PASSWORD))


@override_settings(AGENTFLOW_TRUSTED_PROXIES="1")
def test_login__behind_a_proxy_each_client_is_counted_apart() -> None:
    proxy = {"ip": "10.0.0.2"}
    for _ in range(5):
        log_in("wrong", HTTP_X_FORWARDED_FOR="6.6.6.6, 198.51.100.66", **proxy)
    locked, _ = log_in(PASSWORD, HTTP_X_FORWARDED_FOR="198.51.100.66", **proxy)
    assert locked.status_code == 429
    assert logged_in(*log_in(PASSWORD, HTTP_X_FORWARDED_FOR="203.0.113.5", **proxy))
