"""What the engine stores is JSON every database it runs on keeps as it is: no NUL, no lone
surrogate, no deeper than MAX_DEPTH (Postgres refuses the first two; every reader recurses)."""

from __future__ import annotations

from typing import Any

import pytest

from agentflow._core.serialization import MAX_DEPTH, NotJSONError, to_json


def nested(depth: int) -> Any:
    """`depth` lists, one inside the next, built without recursion."""
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_to_json__text_json_and_postgres_keep__round_trips() -> None:
    value = {"name": "Zoë 😀", "n": [1, 2.5, None, True], "deep": nested(MAX_DEPTH - 1)}

    assert to_json(value, "it") == value
    assert to_json(nested(MAX_DEPTH), "it") == nested(MAX_DEPTH)


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({"text": "a\x00b"}, "it holds a NUL character or a lone surrogate"),
        ({"a\x00": 1}, "it holds a NUL character or a lone surrogate"),
        (["\ud800"], "it holds a NUL character or a lone surrogate"),
        ({"k": nested(MAX_DEPTH)}, f"it is nested deeper than {MAX_DEPTH} levels"),
        (nested(MAX_DEPTH + 1), f"it is nested deeper than {MAX_DEPTH} levels"),
        (nested(100_000), f"it is nested deeper than {MAX_DEPTH} levels"),
        (float("inf"), "it is not JSON: Out of range float values"),
    ],
    ids=[
        "nul-value",
        "nul-key",
        "lone-surrogate",
        "deep-in-a-dict",
        "one-too-deep",
        "very-deep",
        "infinity",
    ],
)
def test_to_json__what_a_database_cannot_keep__refused_with_the_reason(
    value: Any, says: str
) -> None:
    with pytest.raises(NotJSONError) as refused:
        to_json(value, "it")

    assert str(refused.value).startswith(says)


def test_to_json__a_value_that_contains_itself__refused() -> None:
    loop: list[Any] = []
    loop.append(loop)

    with pytest.raises(NotJSONError, match="it is not JSON: Circular reference"):
        to_json(loop, "it")
