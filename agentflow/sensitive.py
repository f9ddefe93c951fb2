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
conversation or an error is masked as well as the argument itself.
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


def redacted(value: str) -> str:
    """What is shown instead of a sensitive text: its size, never its words."""
    return f"redacted ({len(value):,} character{'s' if len(value) != 1 else ''})"


class Redactor:
    """Masks every occurrence of some texts in values about to be shown.

    An occurrence is a whole word or words (a value "flu" leaves "influence" alone), found as
    written or as JSON escapes it inside a string; a value that is the whole text becomes
    `redacted(...)` itself. With no texts it changes nothing.
    """

    def __init__(self, texts: Iterable[str] = ()) -> None:
        unique = sorted({t for t in texts if t.strip()}, key=len, reverse=True)
        self._whole = {text: redacted(text) for text in unique}
        forms: dict[str, str] = {}
        for text in unique:
            for form in (text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]):
                forms.setdefault(form, redacted(text))
        self._forms = forms
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
        return self._pattern.sub(lambda m: self._forms[m.group(0)], value)

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
