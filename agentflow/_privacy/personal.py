"""What a workflow declares personal, and whose it is."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from agentflow.exceptions import DefinitionError


@dataclass(frozen=True, init=False)
class Personal:
    """Which fields of what a run stores are personal, and whose they are.

        Personal(subject=lambda input: input["email"], fields=["email", "name", "waiver.details"])

    `fields` are keys of JSON objects, as `Sensitive` names arguments; a dotted name
    ("waiver.details") walks into nested objects. Each is matched wherever the run stores a
    JSON value (its input, its steps' outputs and arguments, signal payloads, wait outcomes,
    event data), at any depth, so a copy of an output inside an event is sealed too.
    `subject(input)` names the person (an e-mail, a customer id): their key seals the values.
    """

    subject: Callable[[Any], str]
    fields: tuple[tuple[str, ...], ...]

    def __init__(self, *, subject: Callable[[Any], str], fields: Iterable[str]) -> None:
        if not callable(subject):
            raise DefinitionError("Personal(subject=...) is a function of the run's input")
        names = [fields] if isinstance(fields, str) else list(fields)
        paths = []
        for name in names:
            if not isinstance(name, str) or not all(name.split(".")):
                raise DefinitionError(
                    f"Personal fields are key names such as 'email' or 'waiver.details', "
                    f"not {name!r}"
                )
            paths.append(tuple(name.split(".")))
        if not paths:
            raise DefinitionError("Personal(...) names at least one field")
        object.__setattr__(self, "subject", subject)
        object.__setattr__(self, "fields", tuple(dict.fromkeys(paths)))

    def names(self) -> list[str]:
        return [".".join(path) for path in self.fields]

    def subject_of(self, input: Any) -> str:
        """The person `input` belongs to; DefinitionError when it names none."""
        try:
            found = self.subject(input)
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise DefinitionError(
                f"Personal(subject=...) found no subject in the input: {exc!r}"
            ) from None
        if not isinstance(found, str) or not found.strip():
            raise DefinitionError("Personal(subject=...) must return the subject as text")
        return found.strip()


def seal_paths(value: Any, paths: Iterable[tuple[str, ...]], seal: Callable[[Any], Any]) -> Any:
    """A copy of `value` with every field at one of `paths` (anchored at any depth) sealed."""
    wanted = tuple(paths)
    if not wanted:
        return value
    return _walk(value, wanted, seal)


def _walk(value: Any, paths: tuple[tuple[str, ...], ...], seal: Callable[[Any], Any]) -> Any:
    if isinstance(value, list):
        return [_walk(item, paths, seal) for item in value]
    if not isinstance(value, dict) or "$enc" in value:
        return value
    out = {key: _walk(item, paths, seal) for key, item in value.items()}
    for path in paths:
        _seal_at(out, path, seal)
    return out


def _seal_at(obj: dict[str, Any], path: tuple[str, ...], seal: Callable[[Any], Any]) -> None:
    head, rest = path[0], path[1:]
    if head not in obj or obj[head] is None:
        return
    if not rest:
        if not (isinstance(obj[head], dict) and "$enc" in obj[head]):
            obj[head] = seal(obj[head])
        return
    inner = obj[head]
    if isinstance(inner, dict) and "$enc" not in inner:
        obj[head] = inner = dict(inner)
        _seal_at(inner, rest, seal)
