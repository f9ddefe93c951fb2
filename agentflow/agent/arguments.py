"""A tool's arguments: a JSON schema derived from its type hints, and validation before a call.

pydantic builds both from the same declaration, so what the model is shown and what is checked
cannot drift apart. Validation is strict (a string is not an integer) and runs on the
arguments as canonical JSON reads them, so `4500.0` is the integer 4500 here as it is in a
fingerprint.
"""

from __future__ import annotations

import inspect
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pydantic
from pydantic.json_schema import GenerateJsonSchema

from agentflow._base.canonical import NotCanonicalError, normalise
from agentflow.exceptions import DefinitionError

_PARAMETER_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One reason arguments were refused: the field (empty for the whole) and what is wrong."""

    field: str
    problem: str

    def as_json(self) -> dict[str, str]:
        return {"field": self.field, "problem": self.problem}

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}" if self.field else self.problem


class InvalidArguments(ValueError):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


class Arguments(Protocol):
    """What a tool's arguments offer: a local tool's from its type hints (`ArgumentSpec`), an
    MCP server's from its listing (`agent.mcp_tools`)."""

    @property
    def names(self) -> tuple[str, ...]: ...

    @property
    def schema(self) -> dict[str, Any]: ...

    def validate(self, arguments: Any) -> dict[str, Any]: ...


class _WithoutTitles(GenerateJsonSchema):
    """pydantic titles every field with its name: noise for the model, and one more thing a
    library upgrade could change in every recorded model turn's fingerprint."""

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


class ArgumentSpec:
    """The parameters of `fn` after its first (the ToolContext), as a pydantic model."""

    def __init__(self, tool: str, fn: Callable[..., Any]) -> None:
        self.tool = tool
        self._model = _model_for(tool, fn)
        self.names = tuple(self._model.model_fields)
        try:
            schema = self._model.model_json_schema(schema_generator=_WithoutTitles)
        except pydantic.PydanticUserError as exc:
            raise DefinitionError(
                f"tool {tool!r}: no JSON schema for its arguments: {exc}"
            ) from None
        schema.pop("title", None)
        self.schema: dict[str, Any] = schema

    def validate(self, arguments: Any) -> dict[str, Any]:
        """The arguments as the tool function's keyword arguments, typed by its hints.

        Raises:
            InvalidArguments: not a JSON object, or a field missing, extra or of the wrong type.
        """
        if not isinstance(arguments, dict):
            raise InvalidArguments(
                [
                    Problem(
                        field="", problem=f"arguments must be a JSON object, got {_kind(arguments)}"
                    )
                ]
            )
        try:
            text = json.dumps(normalise(arguments))
        except NotCanonicalError as exc:
            raise InvalidArguments([Problem(field="", problem=str(exc))]) from None
        try:
            parsed = self._model.model_validate_json(text)
        except pydantic.ValidationError as exc:
            raise InvalidArguments(
                [
                    Problem(field=_path(error["loc"]), problem=error["msg"])
                    for error in exc.errors(include_url=False)
                ]
            ) from None
        return {name: getattr(parsed, name) for name in self.names}


def _model_for(tool: str, fn: Callable[..., Any]) -> type[pydantic.BaseModel]:
    parameters = list(inspect.signature(fn).parameters.values())
    if not parameters or parameters[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise DefinitionError(f"tool {tool!r}: its first parameter must take the ToolContext")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except (NameError, TypeError) as exc:
        raise DefinitionError(f"tool {tool!r}: cannot read its type hints: {exc}") from None
    fields: dict[str, Any] = {}
    for parameter in parameters[1:]:
        if parameter.kind not in _PARAMETER_KINDS:
            raise DefinitionError(
                f"tool {tool!r}: parameter {parameter.name!r} must be a plain named parameter "
                "(no *args, **kwargs or positional-only): the model passes arguments by name"
            )
        if parameter.name not in hints:
            raise DefinitionError(
                f"tool {tool!r}: parameter {parameter.name!r} has no type hint, so it has no "
                "JSON schema"
            )
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[parameter.name] = (hints[parameter.name], default)
    try:
        return pydantic.create_model(
            f"{tool}_arguments",
            __config__=pydantic.ConfigDict(extra="forbid", strict=True),
            **fields,
        )
    except (pydantic.PydanticUserError, NameError, TypeError) as exc:
        raise DefinitionError(
            f"tool {tool!r}: its parameters are not a valid schema: {exc}"
        ) from None


def _path(location: tuple[int | str, ...]) -> str:
    path = ""
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def _kind(value: Any) -> str:
    # A string is either JSON text holding a string or text that is not JSON at all.
    names = {str: "a string or text that is not JSON", list: "an array", bool: "a boolean"}
    names[type(None)] = "null"
    return names.get(type(value), "a number")
