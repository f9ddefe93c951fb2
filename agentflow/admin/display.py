"""How run and step values look in the admin: status badges, ages, pretty-printed payloads."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.html import format_html

from agentflow.models import WorkflowRun
from agentflow.states import RunStatus

#: Payloads are cut here so one huge output cannot stall the page.
MAX_PAYLOAD_CHARS = 20_000


def duration(delta: timedelta) -> str:
    seconds = max(int(delta.total_seconds()), 0)
    if seconds < 120:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 120:
        return f"{minutes} min {seconds} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def when(value: datetime | None) -> str:
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S") if value else "—"


def ago(value: datetime, now: datetime) -> str:
    return format_html('<span title="{}">{} ago</span>', when(value), duration(now - value))


def badge(status: str, label: str) -> str:
    """A coloured status word; the colours live in templates/admin/agentflow/_styles.html."""
    return format_html('<span class="af-badge af-{}">{}</span>', status.lower(), label)


def pretty(value: Any, *, text: bool = False) -> str:
    """A payload for reading: JSON indented, anything else as text, always escaped; past
    MAX_PAYLOAD_CHARS a preview with the whole size, so a 5 MB output costs the page 20 kB."""
    if value in (None, "", [], {}):
        return "—"
    shown = str(value) if text else json.dumps(value, indent=2, sort_keys=True, default=str)
    if len(shown) <= MAX_PAYLOAD_CHARS:
        return format_html('<pre class="af-pre">{}</pre>', shown)
    size = len(shown.encode("utf-8", errors="replace"))
    return format_html(
        '<pre class="af-pre">{}\n…</pre><div class="af-cut">Preview of the first {} characters; '
        "{} in all ({} characters).</div>",
        shown[:MAX_PAYLOAD_CHARS],
        f"{MAX_PAYLOAD_CHARS:,}",
        byte_size(size),
        f"{len(shown):,}",
    )


def byte_size(size: int) -> str:
    """1,234 bytes / 12.3 kB / 5.2 MB: decimal units, as a file listing shows them."""
    if size < 1000:
        return f"{size:,} bytes"
    if size < 1_000_000:
        return f"{size / 1000:.1f} kB"
    return f"{size / 1_000_000:.1f} MB"


def wake_up(run: WorkflowRun, now: datetime) -> str:
    """What the sweeper sees: due later, overdue (its backlog), parked, or nothing (finished)."""
    if run.status == RunStatus.NEEDS_ATTENTION:
        return format_html('<span class="af-parked">{}</span>', "waits for an operator")
    if run.wake_at is None:
        return "—"
    if run.wake_at < now:
        return format_html(
            '<span class="af-overdue" title="{}">overdue by {}</span>',
            when(run.wake_at),
            duration(now - run.wake_at),
        )
    return format_html(
        '<span title="{}">in {}</span>', when(run.wake_at), duration(run.wake_at - now)
    )
