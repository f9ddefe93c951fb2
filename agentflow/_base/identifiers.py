"""The rule for names an operator reads and types — partner keys, build ids, workflow, step and
signal names: any character a real system uses, refused at configuration time only for what
would break a row, a log line or a page later.

A model's name is a partner key (`openai/gpt-4o-mini`), a release's build id may be
`release/2026.12:rc 1`, a signal may be named in any script. So "/", ":", ".", spaces and
non-ASCII letters are all names, and every page, URL, metric label and command must carry them
(the admin quotes them in URLs as it quotes object ids). What is refused is what no column or
line can hold faithfully: an empty name, one longer than its column, a control character
(Postgres text cannot hold NUL; a newline would split a log line), and a space at either end (two
keys that differ only in a space nobody sees).
"""

from __future__ import annotations

import unicodedata
from typing import Any

#: Control characters and lone surrogates (which no UTF-8 column can hold).
_REFUSED_CATEGORIES = ("Cc", "Cs")


def problem(what: str, value: Any, *, max_chars: int) -> str:
    """Why `value` cannot be a `what` ("partner key"), as one sentence; empty when it can."""
    rule = f"a {what} is 1-{max_chars} characters, no control character, no space at its ends"
    if not isinstance(value, str) or not value:
        return f"{rule}, not {value!r}"
    if len(value) > max_chars:
        return f"{rule}: {value[:40]!r}… has {len(value)}"
    for char in value:
        if unicodedata.category(char) in _REFUSED_CATEGORIES:
            return f"{rule}: {value!r} holds U+{ord(char):04X}"
    if value != value.strip():
        return f"{rule}: {value!r} has a space at an end"
    return ""
