"""Readable diffs of a recorded call against the call made now at the same position.

An operator reads this in the admin to decide whether to fork: it must say which field changed
(the tool's arguments, the last message, a tool's description), not dump two JSON documents.
Lists are aligned before they are compared, so one message added in the middle of a
conversation reads as one insertion, not as every later message having changed.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

from agentflow._base.canonical import canonical_json
from agentflow.agent.fingerprint import Fingerprint

#: A rendered value longer than this is cut, around its first difference for strings.
MAX_VALUE_CHARS = 160
#: Context kept on each side of the first difference of two long strings.
STRING_CONTEXT_CHARS = 60
#: Changes listed in full; the rest are counted (a rewritten prompt can differ everywhere).
MAX_CHANGES = 20

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ABSENT = object()


@dataclass(frozen=True, kw_only=True)
class Change:
    """One difference: where (`messages[4].content.seat`), and both sides, rendered."""

    path: str
    recorded: str
    now: str

    def as_json(self) -> dict[str, str]:
        return {"path": self.path, "recorded": self.recorded, "now": self.now}


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """The call made now at `position` is not the one recorded there."""

    position: int
    recorded: str
    now: str
    changes: tuple[Change, ...]
    #: Changes beyond MAX_CHANGES, counted but not listed.
    more: int = 0

    @property
    def summary(self) -> str:
        if self.recorded == self.now:
            return f"Position {self.position} diverged: the {self.now} changed."
        return f"Position {self.position} diverged: recorded {self.recorded}, now {self.now}."

    def text(self) -> str:
        """The summary, then one line (or a recorded/now pair) per change."""
        lines = [self.summary]
        for change in self.changes:
            single = f"  {change.path}: {change.recorded} → {change.now}"
            if len(single) <= 100:
                lines.append(single)
            else:
                lines += [
                    f"  {change.path}",
                    f"    recorded: {change.recorded}",
                    f"    now:      {change.now}",
                ]
        if self.more:
            lines.append(f"  … and {self.more} more change{'s' if self.more > 1 else ''}")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        """For an event or the run's error details; `text` is what a person reads."""
        return {
            "position": self.position,
            "summary": self.summary,
            "recorded": self.recorded,
            "now": self.now,
            "changes": [change.as_json() for change in self.changes],
            "more": self.more,
            "text": self.text(),
        }


def diverges(recorded: Fingerprint, now: Fingerprint) -> Divergence | None:
    """None when `now` is the recorded call; else what differs, field by field."""
    if recorded.matches(now):
        return None
    changes: list[Change] = []
    if recorded.kind != now.kind or recorded.name != now.name:
        changes.append(Change(path="call", recorded=recorded.describe(), now=now.describe()))
    changes += diff_values(recorded.arguments, now.arguments, root="arguments")
    if recorded.position != now.position:  # a caller bug; say so rather than hide it
        changes.insert(
            0, Change(path="position", recorded=str(recorded.position), now=str(now.position))
        )
    return Divergence(
        position=recorded.position,
        recorded=recorded.describe(),
        now=now.describe(),
        changes=tuple(changes[:MAX_CHANGES]),
        more=max(0, len(changes) - MAX_CHANGES),
    )


def diff_values(recorded: Any, now: Any, *, root: str = "") -> list[Change]:
    """Every difference between two JSON values, as changes with paths under `root`.

    For an LLM call the arguments are `{"model", "messages", "tools"}`, so paths read
    `arguments.messages[4].content`; a string holding JSON (a tool result's content, a tool
    call's arguments) is compared as JSON, so the path goes on into it.
    """
    changes: list[Change] = []
    _diff(recorded, now, root, changes)
    return changes


def _diff(recorded: Any, now: Any, path: str, out: list[Change]) -> None:
    if recorded is _ABSENT or now is _ABSENT:
        out.append(Change(path=path, recorded=_render(recorded), now=_render(now)))
        return
    if canonical_json(recorded) == canonical_json(now):
        return
    if isinstance(recorded, dict) and isinstance(now, dict):
        for key in sorted(recorded.keys() | now.keys()):
            _diff(recorded.get(key, _ABSENT), now.get(key, _ABSENT), _key(path, key), out)
        return
    if isinstance(recorded, list) and isinstance(now, list):
        _diff_lists(recorded, now, path, out)
        return
    if isinstance(recorded, str) and isinstance(now, str):
        parsed = _as_json_document(recorded), _as_json_document(now)
        if parsed[0] is not _ABSENT and parsed[1] is not _ABSENT:
            found = len(out)
            _diff(parsed[0], parsed[1], path, out)
            if len(out) > found:
                return  # else the same document written differently: show the text
        out.append(_string_change(path, recorded, now))
        return
    out.append(Change(path=path or "value", recorded=_render(recorded), now=_render(now)))


def _diff_lists(recorded: list[Any], now: list[Any], path: str, out: list[Change]) -> None:
    """Align the two lists on equal elements; replaced runs of one length pair up item by
    item, other runs read as removed (recorded only) or added (now only) elements."""
    keys_recorded = [canonical_json(item) for item in recorded]
    keys_now = [canonical_json(item) for item in now]
    matcher = SequenceMatcher(a=keys_recorded, b=keys_now, autojunk=False)
    for tag, r_start, r_end, n_start, n_end in matcher.get_opcodes():
        if tag == "equal":
            continue
        if tag == "replace" and r_end - r_start == n_end - n_start:
            for offset in range(r_end - r_start):
                index = n_start + offset
                _diff(recorded[r_start + offset], now[index], f"{path}[{index}]", out)
            continue
        for index in range(r_start, r_end):
            out.append(Change(path=f"{path}[{index}]", recorded=_render(recorded[index]), now="—"))
        for index in range(n_start, n_end):
            out.append(Change(path=f"{path}[{index}]", recorded="—", now=_render(now[index])))


def _string_change(path: str, recorded: str, now: str) -> Change:
    """Short strings whole; long ones cut to a window around their first difference."""
    if len(recorded) <= MAX_VALUE_CHARS and len(now) <= MAX_VALUE_CHARS:
        return Change(path=path, recorded=_quote(recorded), now=_quote(now))
    start = 0
    limit = min(len(recorded), len(now))
    while start < limit and recorded[start] == now[start]:
        start += 1
    begin = max(0, start - STRING_CONTEXT_CHARS)
    return Change(
        path=f"{path} (from character {start})",
        recorded=_window(recorded, begin, start),
        now=_window(now, begin, start),
    )


def _window(text: str, begin: int, start: int) -> str:
    end = start + STRING_CONTEXT_CHARS
    excerpt = _quote(text[begin:end])
    return f"{'…' if begin else ''}{excerpt}{'…' if end < len(text) else ''}"


def _as_json_document(text: str) -> Any:
    """The object or array a string holds, else _ABSENT (plain text stays text)."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return _ABSENT
    try:
        return json.loads(stripped)
    except ValueError:
        return _ABSENT


def _key(path: str, key: str) -> str:
    if _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _render(value: Any) -> str:
    if value is _ABSENT:
        return "—"
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 1] + "…"
