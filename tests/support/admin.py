"""Admin test helpers: runs in the shapes the engine leaves them in, page URLs, and the step
messages an action published on the test's Redis broker."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from agentflow._base.states import ACTIVE_RUN_STATUSES, RunStatus, StepStatus
from agentflow._core.dispatch import RUN_STEP_TASK
from agentflow.models import RunEvent, StepCheckpoint, WorkflowRun
from config.celery_app import app as celery_app

LIST_URL = "/admin/agentflow/workflowrun/"
#: The demo workflow's steps (config/workflows.py): retry resumes at one of these.
DEMO_STEPS = ("greet", "pretend_effect", "summarise")


# --- runs in the shapes the engine leaves them in ---------------------------------------------
def make_run(
    status: str,
    *,
    steps: int = 2,
    wake_in: float = 30.0,
    created_ago: timedelta | None = None,
    business_key: str | None = None,
    events: tuple[tuple[str, str, str], ...] = (),
) -> WorkflowRun:
    """A demo run whose last checkpoint matches `status` (PENDING has none yet)."""
    now = timezone.now()
    steps = 0 if status == RunStatus.PENDING else steps
    seq = max(steps, 1)
    run = WorkflowRun.objects.create(
        workflow="demo",
        version=1,
        input={"name": "Ana", "nested": {"list": [1, 2, 3]}},
        status=status,
        current_step=DEMO_STEPS[seq - 1],
        current_seq=seq,
        output={"greeting": "hello, Ana"} if status == RunStatus.COMPLETED else None,
        error="pretend_effect: card declined" if status == RunStatus.FAILED else "",
        business_key=business_key,
        wake_at=now + timedelta(seconds=wake_in) if status in ACTIVE_RUN_STATUSES else None,
    )
    if status == RunStatus.NEEDS_ATTENTION:
        WorkflowRun.objects.filter(pk=run.pk).update(error="key window passed; reconcile unsure")
    for n in range(1, steps + 1):
        last = n == steps
        step_status, lease = StepStatus.COMPLETED, None
        if last and status in (RunStatus.RUNNING, RunStatus.NEEDS_ATTENTION):
            step_status = StepStatus.IN_PROGRESS
            lease = now + timedelta(seconds=30 if status == RunStatus.RUNNING else -3600)
        elif last and status in (RunStatus.FAILED, RunStatus.WAITING):
            step_status = StepStatus.FAILED
        StepCheckpoint.objects.create(
            run=run,
            seq=n,
            name=DEMO_STEPS[n - 1],
            kind="read" if n % 2 else "effect",
            status=step_status,
            attempts=3 if last else 1,
            idempotency_key=f"{run.pk}_step_{n}",
            output={"step": n, "detail": "x" * 40} if step_status == StepStatus.COMPLETED else None,
            error="HTTP 402 card_declined" if step_status == StepStatus.FAILED else "",
            retryable=status == RunStatus.WAITING,
            lease_owner="celery@w1:123:abc" if lease else "",
            lease_expires_at=lease,
            first_started_at=now,
            started_at=now,
            finished_at=None if step_status == StepStatus.IN_PROGRESS else now,
        )
    for kind, actor, detail in events:
        RunEvent.objects.create(run=run, kind=kind, actor=actor, detail=detail)
    if created_ago is not None:
        WorkflowRun.objects.filter(pk=run.pk).update(created_at=now - created_ago)
    run.refresh_from_db()
    return run


def detail_url(run: WorkflowRun, page: str = "change") -> str:
    return f"{LIST_URL}{quote(run.pk)}/{page}/"


def text(response: Any) -> str:
    return response.content.decode()


@pytest.fixture
def viewer(client: Client) -> Client:
    """Staff with the view permission only: may look, may not act."""
    user = User.objects.create_user("viewer", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_workflowrun"))
    client.force_login(user)
    return client


#: The console's roles (docs/console.md, "Who sees what"), by their permissions. A reader
#: holds the view permission and the one a declaration names: a test adds its own.
CONSOLE_ROLES: dict[str, tuple[str, ...]] = {
    "superuser": (),
    "viewer": ("agentflow.view_workflowrun",),
    "operator": ("agentflow.change_workflowrun",),
    "approver": ("agentflow.view_workflowrun", "agentflow.approve_workflowrun"),
    "approver_only": ("agentflow.approve_workflowrun",),
    "partners_viewer": ("agentflow.view_partnerstate",),
    "partner_operator": ("agentflow.pause_partnerstate",),
}


def as_role(role: str, roles: Mapping[str, tuple[str, ...]] = CONSOLE_ROLES) -> Client:
    """A client logged in as `role` of `roles`, its username the role's name."""
    return as_user(role, roles[role], superuser=role == "superuser")


def holds(role: str, roles: Mapping[str, tuple[str, ...]], *permissions: str) -> bool:
    """Does `role` hold any of `permissions` ("app.codename"; a superuser holds all)?"""
    return role == "superuser" or any(p in roles[role] for p in permissions)


def as_user(username: str, permissions: Iterable[str] = (), *, superuser: bool = False) -> Client:
    """A client logged in as a staff user holding `permissions` ("app.codename", or a codename
    only one app has), or as a superuser: one role of the console's."""
    if superuser:
        user = User.objects.create_superuser(username, password="x")
    else:
        user = User.objects.create_user(username, password="x", is_staff=True)
    for permission in permissions:
        app, _, codename = permission.rpartition(".")
        found = Permission.objects.filter(codename=codename)
        user.user_permissions.add(found.get(content_type__app_label=app) if app else found.get())
    client = Client()
    client.force_login(user)
    return client


def first_status(response: Any) -> int:
    """The status a request was first answered with, when its redirects were followed."""
    return response.redirect_chain[0][1] if response.redirect_chain else response.status_code


def published_steps(run_id: str) -> list[list[Any]]:
    """Arguments of the step messages for `run_id` on the test's Redis broker (taken off it)."""
    found = []
    with celery_app.connection_for_write() as conn:
        redis = conn.default_channel.client
        for raw in redis.lrange("celery", 0, -1):
            message = json.loads(raw)
            if message["headers"]["task"] != RUN_STEP_TASK:
                continue
            args = json.loads(base64.b64decode(message["body"]))[0]
            if args[0] == run_id:
                found.append(args)
                redis.lrem("celery", 1, raw)
    return found
