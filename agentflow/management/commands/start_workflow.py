"""`manage.py start_workflow NAME --input JSON`: start a run from the shell."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError

from agentflow import durable
from agentflow.management.base import BaseCommand, json_argument


class Command(BaseCommand):
    help = "Start a workflow run and print its id."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("workflow", help="registered workflow name, e.g. demo")
        parser.add_argument("--input", default="{}", help="the run's input, as JSON")
        parser.add_argument("--business-key", default=None, help="same key, same run")

    def handle(
        self, *args: Any, workflow: str, input: str, business_key: str | None, **options: Any
    ) -> None:
        payload = json_argument(input, "--input")
        try:
            run_id = durable.start(workflow, input=payload, business_key=business_key)
        except durable.AgentflowError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(run_id)
