"""The SMTP sink: accepts any mail and records it once per Message-ID, counting deliveries."""

from __future__ import annotations

import asyncio
import email
import email.message
import email.policy
import json
import logging
import secrets
import time
from typing import Any

from aiosmtpd.controller import Controller

from refunds.sandbox import faults
from refunds.sandbox.state import Store


class SinkHandler:
    """aiosmtpd handler: a redelivered Message-ID is the same email; it only bumps `deliveries`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.store.count("requests", "smtp")
        fault = faults.plan(self.store, "smtp")
        if fault.latency_ms:
            await asyncio.sleep(fault.latency_ms / 1000)
        if fault.error_status is not None:
            return "451 4.3.0 Injected sandbox fault, try again later"
        record(self.store, envelope.content, envelope.rcpt_tos)
        if fault.drop:
            # Accepted and recorded, but the client never hears "250": it must redeliver.
            server.transport.close()
        return "250 OK"


def record(store: Store, content: bytes, recipients: list[str]) -> str:
    """Store one delivery; returns its Message-ID (a made-up one if the message has none)."""
    message = email.message_from_bytes(content, policy=email.policy.default)
    message_id = str(message.get("Message-ID", "")).strip() or f"<missing-{secrets.token_hex(8)}>"
    workflow_id = message.get("X-Agentflow-Workflow")
    to = [str(address) for address in (message.get_all("To") or [])] or list(recipients)
    now = time.time()
    with store.transaction() as db:
        db.execute(
            "INSERT INTO emails (message_id, workflow_id, recipients, subject, body, created,"
            " last_delivery, deliveries) VALUES (?, ?, ?, ?, ?, ?, ?, 1)"
            " ON CONFLICT (message_id) DO UPDATE SET deliveries = deliveries + 1,"
            " last_delivery = excluded.last_delivery",
            (
                message_id,
                str(workflow_id).strip() if workflow_id else None,
                json.dumps(to),
                str(message.get("Subject", "")),
                _text_of(message),
                now,
                now,
            ),
        )
    return message_id


def _text_of(message: email.message.EmailMessage) -> str:
    """The plain-text body, so tests can read what the customer was told."""
    part = message.get_body(preferencelist=("plain",))
    return part.get_content() if part is not None else ""


def start_smtp(store: Store, *, host: str, port: int) -> Controller:
    """Start the sink on its own thread and event loop; `.stop()` it on shutdown."""
    # aiosmtpd logs every connection at INFO; a chaos run would drown the console.
    logging.getLogger("mail.log").setLevel(logging.WARNING)
    controller = Controller(SinkHandler(store), hostname=host, port=port)
    controller.start()
    return controller
