"""Arguments only some people may read: declared on a step or tool, and masked wherever else they
would be shown.

A step's approval arguments or a tool's arguments may carry what the person a run serves told us
in confidence (a customer's medical emergency, a bereavement). The definition declares which
arguments those are and which permission, besides deciding the call, lets a person read them
(`Sensitive`); the admin shows them to those people and "redacted (N characters)" to everyone
else (`agentflow.admin.privacy`). The engine never logs, traces or counts an argument's value, so
logs, traces and metrics carry none of them whatever is declared.

`Redactor` does the masking, by value: every text shown is searched for each sensitive value
(also as JSON writes it inside a string, as a model's tool call does), so a copy in an event, a
conversation or an error is masked as well as the argument itself; so is a copy that was cut
before it was kept (a divergence's excerpt "…of the note…", an error cut at its column's size).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from agentflow.exceptions import DefinitionError


@dataclass(frozen=True, init=False)
class Sensitive:
    """Which arguments of a call are sensitive, and who besides its deciders may read them.

        Sensitive("details", readers=["refunds.view_refundrequest"])

    `arguments` name top-level keys of the call's arguments (a graph step's
    `approval_arguments(ctx)`, a tool's parameters). `readers` are permissions ("app.codename")
    whose holders may read them, as holders of `agentflow.approve_workflowrun` may (they must,
    to decide); both also need to see the run.
    """

    arguments: tuple[str, ...]
    readers: tuple[str, ...]

    def __init__(self, *arguments: str, readers: Iterable[str] = ()) -> None:
        if not arguments or not all(isinstance(a, str) and a for a in arguments):
            raise DefinitionError("Sensitive(...) names at least one argument, by its name")
        found = tuple(readers)
        if isinstance(readers, str) or not all(_is_permission(p) for p in found):
            raise DefinitionError(
                f"Sensitive readers are permissions such as 'app.view_model', not {readers!r}"
            )
        object.__setattr__(self, "arguments", tuple(dict.fromkeys(arguments)))
        object.__setattr__(self, "readers", found)

    def values(self, arguments: Any) -> Iterator[str]:
        """The text of every sensitive argument in `arguments` (each string inside one)."""
        if not isinstance(arguments, dict):
            return
        for name in self.arguments:
            yield from texts(arguments.get(name))


#: A cut copy of a value is masked when at least this many of its characters are left beside
#: the cut (fewer say nothing of it, and would mask common words).
MIN_CUT_CHARS = 12
#: What marks where a text was cut (agentflow's excerpts and previews).
CUT = "…"


def redacted(value: str) -> str:
    """What is shown instead of a sensitive text: its size, never its words."""
    return f"redacted ({len(value):,} character{'s' if len(value) != 1 else ''})"


class Redactor:
    """Masks every occurrence of some texts in values about to be shown.

    An occurrence is a whole word or words (a value "flu" leaves "influence" alone), found as
    written or as JSON escapes it inside a string; a value that is the whole text becomes
    `redacted(...)` itself. A cut copy is an occurrence too: MIN_CUT_CHARS or more characters
    of a value just before or after a "…", or ending the text. With no texts it changes nothing.
    """

    def __init__(self, texts: Iterable[str] = ()) -> None:
        unique = sorted({t for t in texts if t.strip()}, key=len, reverse=True)
        self._whole = {text: redacted(text) for text in unique}
        forms: dict[str, str] = {}
        for text in unique:
            for form in (text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]):
                forms.setdefault(form, redacted(text))
        self._forms = forms
        self._longest = max(map(len, forms), default=0)
        longest_first = sorted(forms, key=len, reverse=True)
        alternatives = "|".join(rf"(?<!\w){re.escape(form)}(?!\w)" for form in longest_first)
        self._pattern = re.compile(alternatives) if forms else None

    def __bool__(self) -> bool:
        return self._pattern is not None

    def text(self, value: str) -> str:
        if self._pattern is None or not value:
            return value
        whole = self._whole.get(value)
        if whole is not None:
            return whole
        return self._cut_copies(self._pattern.sub(lambda m: self._forms[m.group(0)], value))

    def _cut_copies(self, text: str) -> str:
        """`text` with each cut copy of a value masked: the longest piece of a value found
        just before a cut (or the text's end) and just after one."""
        cuts = [at for at, char in enumerate(text) if char == CUT]
        found = [self._piece(text, end=_skip_back(text, at)) for at in [*cuts, len(text)]]
        found += [self._piece(text, start=_skip(text, at + 1)) for at in cuts]
        merged: list[list[Any]] = []
        for start, end, shown in sorted(f for f in found if f):
            if merged and start <= merged[-1][1]:  # overlapping pieces are masked as one
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end, shown])
        for start, end, shown in reversed(merged):
            text = text[:start] + shown + text[end:]
        return text

    def _piece(
        self, text: str, *, start: int | None = None, end: int | None = None
    ) -> tuple[int, int, str] | None:
        """The longest piece of a value ending at `end` (or starting at `start`) in `text`, as
        (start, end, its mask); None below MIN_CUT_CHARS. A shorter piece of a piece is one
        too, so the longest is found by halving."""

        def span(size: int) -> tuple[int, int]:
            return (end - size, end) if end is not None else (start or 0, (start or 0) + size)

        def owner(size: int) -> str | None:
            a, b = span(size)
            piece = text[a:b]
            return next((form for form in self._forms if piece in form), None)

        room = end if end is not None else len(text) - (start or 0)
        low, high = MIN_CUT_CHARS, min(room, self._longest)
        if high < low or owner(low) is None:
            return None
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if owner(middle) is not None else (low, middle - 1)
        form = owner(low)
        assert form is not None
        a, b = span(low)
        return a, b, self._forms[form]

    def value(self, value: Any) -> Any:
        """A JSON value (or any value whose strings are shown) with every occurrence masked."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.text(str(k)): self.value(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.value(v) for v in value]
        return value


#: What may stand between a cut and the piece of a value beside it: a quote, a space.
_BESIDE_CUT = "\"' \n"


def _skip(text: str, at: int) -> int:
    """Where a piece after a cut at `at` may start: past up to two quotes or spaces."""
    for _ in range(2):
        if at < len(text) and text[at] in _BESIDE_CUT:
            at += 1
    return at


def _skip_back(text: str, at: int) -> int:
    """Where a piece before a cut (or the text's end) at `at` may end."""
    for _ in range(2):
        if at > 0 and text[at - 1] in _BESIDE_CUT:
            at -= 1
    return at


def texts(value: Any, *, numbers: bool = True) -> Iterator[str]:
    """Every string inside a JSON value (and, with `numbers`, every number as written)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from texts(item, numbers=numbers)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from texts(item, numbers=numbers)
    elif numbers and isinstance(value, int | float) and not isinstance(value, bool):
        yield str(value)


def _is_permission(value: Any) -> bool:
    return isinstance(value, str) and value.count(".") == 1 and all(value.split("."))
