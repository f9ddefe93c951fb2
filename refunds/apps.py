"""The refund domain app: the customer form, the refund workflow, partner clients, sandbox."""

from __future__ import annotations

from django.apps import AppConfig


class RefundsConfig(AppConfig):
    name = "refunds"
    verbose_name = "Refunds"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The run's admin page links to the refund and to the Stripe objects its steps made.
        from agentflow import durable
        from refunds import engines, links

        for workflow in (engines.GRAPH, engines.AGENT):
            durable.register_links(workflow, run=links.refund_links, step=links.stripe_links)
