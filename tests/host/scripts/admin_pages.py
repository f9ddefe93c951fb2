"""Run by the fresh venv's Python in the host project (contract item 5): the admin pages of
one run, through Django's test client, logged in as the host's superuser. Prints JSON:
{label: {"status": ..., "timeline": the run's SVG timeline is on the page, "final": the
status after redirects}}.

Every action the run admin offers is asked for its confirmation page: the run page's
buttons (`<id>/<verb>/`, one per `agentflow.admin.actions.VERBS`, and fork) and the list's
actions (a POST of the action without `post=yes`, as the list's "Go" sends it).

Usage: python admin_pages.py RUN_ID USERNAME PASSWORD
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import django

sys.path.insert(0, os.getcwd())  # the project, as manage.py would have it
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
django.setup()

from django.contrib import admin  # noqa: E402
from django.contrib.admin.utils import quote  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402
from django.urls import reverse  # noqa: E402

from agentflow.admin.actions import VERBS  # noqa: E402
from agentflow.models import WorkflowRun  # noqa: E402


def main() -> None:
    run_id, username, password = sys.argv[1:4]
    setup_test_environment()  # the test client's host name
    client = Client(raise_request_exception=False)
    assert client.login(username=username, password=password), "the superuser cannot log in"
    pages: dict[str, dict[str, Any]] = {}

    def record(label: str, response: Any, follow: Any = None) -> None:
        pages[label] = {
            "status": response.status_code,
            # The run page's timeline: one <svg> element of its own class (icons are SVG too).
            "timeline": b'<svg class="af-timeline-svg"' in response.content,
            "final": (follow or response).status_code,
        }

    change = reverse("admin:agentflow_workflowrun_change", args=(quote(run_id),))
    changelist = reverse("admin:agentflow_workflowrun_changelist")
    record(f"GET {change}", client.get(change))
    record(f"GET {changelist}", client.get(changelist))
    for verb in [*VERBS, "fork"]:
        url = reverse(f"admin:agentflow_workflowrun_{verb}", args=(quote(run_id),))
        record(f"GET {url}", client.get(url), client.get(url, follow=True))
    for action in admin.site._registry[WorkflowRun].actions:
        data = {"action": action, "_selected_action": [run_id]}
        record(f"POST {changelist} action={action}", client.post(changelist, data))
    record("GET /agentflow/healthz", client.get("/agentflow/healthz"))
    pages["GET /agentflow/healthz"]["body"] = client.get("/agentflow/healthz").json()
    metrics = client.get("/agentflow/metrics")
    pages["GET /agentflow/metrics"] = {
        "status": metrics.status_code,
        "timeline": False,
        "final": metrics.status_code,
        "body": metrics.content.decode(errors="replace")[:300],
    }
    print(json.dumps(pages))


if __name__ == "__main__":
    main()
