"""Run by the fresh venv's Python in the host project: Django's tasks API as another process of
the shop calls it. Prints one JSON line.

Usage:
  python task_calls.py enqueue ORDER [hold]   # enqueue and commit: {"id"}
  python task_calls.py rollback ORDER         # enqueue in a transaction that rolls back: {"id"}
  python task_calls.py wait ID STATUS         # get_result until STATUS (90 s): the result
  python task_calls.py get ID                 # get_result once: the result, or {"error"}
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import django

sys.path.insert(0, os.getcwd())  # the project, as manage.py would have it
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
django.setup()

from django.db import transaction  # noqa: E402

try:
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2: the backport
    from django_tasks.exceptions import TaskResultDoesNotExist
from orders.tasks import ship_order  # noqa: E402


class RolledBack(Exception):
    pass


def described(result: Any) -> dict[str, Any]:
    def at(value: Any) -> str | None:
        return value.isoformat() if value is not None else None

    return {
        "id": result.id,
        "status": str(result.status),
        "enqueued_at": at(result.enqueued_at),
        "started_at": at(result.started_at),
        "last_attempted_at": at(result.last_attempted_at),
        "finished_at": at(result.finished_at),
        "worker_ids": list(result.worker_ids),
        "attempts": result.attempts,
        "return_value": result.return_value if result.status == "SUCCESSFUL" else None,
        "errors": [e.exception_class_path for e in result.errors],
        "pid": os.getpid(),
    }


def main() -> dict[str, Any]:
    command, *args = sys.argv[1:]
    if command == "enqueue":
        with transaction.atomic():
            result = ship_order.enqueue(int(args[0]), hold=args[1:] == ["hold"])
        return {"id": result.id, "pid": os.getpid()}
    if command == "rollback":
        try:
            with transaction.atomic():
                result = ship_order.enqueue(int(args[0]))
                raise RolledBack
        except RolledBack:
            return {"id": result.id}
    if command == "get":
        try:
            return described(ship_order.get_result(args[0]))
        except TaskResultDoesNotExist as exc:
            return {"error": type(exc).__name__}
    if command == "wait":
        deadline = time.monotonic() + 90
        while True:
            result = ship_order.get_result(args[0])
            if str(result.status) == args[1] or time.monotonic() > deadline:
                return described(result)
            time.sleep(0.05)
    raise SystemExit(f"unknown command {command!r}")


print(json.dumps(main()))
