"""How run and step values look in the admin: status badges, ages, pretty-printed payloads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.html import format_html

from agentflow._base.states import RunStatus
from agentflow.models import WorkflowRun

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
    """A coloured status word; its colours live in admin/agentflow/_styles.html."""
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


# --- values inside a conversation: compact, escaped by the template, never the whole of 5 MB ---
#: A string inside a shown value is cut past this many characters (its whole size is said).
MAX_STRING_CHARS = 400
#: List items and object keys shown; the rest are counted.
MAX_ITEMS = 30
#: Nesting shown; deeper values are summarised.
MAX_DEPTH = 8
#: A value that fits on one line this long is shown on one line, else indented.
ONE_LINE_CHARS = 100
#: The text of one shown value is cut here, whatever its shape.
MAX_SHOWN_CHARS = 4000


@dataclass(frozen=True)
class Shown:
    """A JSON value as an operator reads it: `text` (plain, for the template to escape)."""

    text: str
    #: Written on several lines (an indented object), or one.
    multiline: bool


def compact(value: Any) -> Shown:
    """A JSON value trimmed to read at a glance: long strings, lists and objects are cut with
    their size said in place (`"…" (5.2 MB in all)`), short values stay on one line."""
    trimmed = _trim(value, 0)
    one_line = json.dumps(trimmed, ensure_ascii=False, separators=(", ", ": "), default=str)
    if len(one_line) <= ONE_LINE_CHARS:
        return Shown(one_line, multiline=False)
    text = json.dumps(trimmed, ensure_ascii=False, indent=2, default=str)
    if len(text) > MAX_SHOWN_CHARS:
        text = f"{text[:MAX_SHOWN_CHARS]}\n… (first {MAX_SHOWN_CHARS:,} characters shown)"
    return Shown(text, multiline=True)


def _trim(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        if len(value) <= MAX_STRING_CHARS:
            return value
        size = byte_size(len(value.encode("utf-8", errors="replace")))
        return f"{value[:MAX_STRING_CHARS]}… ({size} in all)"
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return f"{{… {len(value):,} key{'s' if len(value) != 1 else ''}}}"
        kept = {str(k): _trim(v, depth + 1) for k, v in list(value.items())[:MAX_ITEMS]}
        if len(value) > MAX_ITEMS:
            kept["…"] = f"{len(value) - MAX_ITEMS:,} more keys"
        return kept
    if isinstance(value, list | tuple):
        if depth >= MAX_DEPTH:
            return f"[… {len(value):,} item{'s' if len(value) != 1 else ''}]"
        items = [_trim(v, depth + 1) for v in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            items.append(f"… {len(value) - MAX_ITEMS:,} more items")
        return items
    if value is None or isinstance(value, bool | int | float):
        return value
    return str(value)
