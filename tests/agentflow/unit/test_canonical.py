"""Canonical JSON: one text per value, whatever the process, the key order or the number form."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agentflow._base.canonical import NotCanonicalError, canonical_json, digest, normalise

VALUE = {
    "b": [1, 2.5, {"z": None, "a": True}],
    "a": "Bjørn — 東京 ✈",
    "n": {"big": 10**19, "neg": -3, "tiny": 1e-7},
}


def test_canonical_json__sorted_keys_fixed_separators_ascii() -> None:
    text = canonical_json(VALUE)

    assert text == (
        '{"a":"Bj\\u00f8rn \\u2014 \\u6771\\u4eac \\u2708",'
        '"b":[1,2.5,{"a":true,"z":null}],'
        '"n":{"big":10000000000000000000,"neg":-3,"tiny":1e-07}}'
    )
    assert text.isascii()
    assert json.loads(text) == VALUE


def test_canonical_json__key_order_and_tuples_do_not_matter() -> None:
    reordered = {
        "n": {"tiny": 1e-7, "neg": -3, "big": 10**19},
        "a": VALUE["a"],
        "b": (1, 2.5, {"a": True, "z": None}),
    }

    assert canonical_json(reordered) == canonical_json(VALUE)
    assert digest(reordered) == digest(VALUE)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        (1, 1.0),  # the same JSON number; jsonb may hand back either form
        (0, -0.0),
        (4500, 4500.0),
        (10**20, 1e20),
        (10**100, 1e100),  # jsonb returns 1e100 as an exact integer
    ],
)
def test_canonical_json__numbers_are_written_by_value(left: object, right: object) -> None:
    assert canonical_json(left) == canonical_json(right)


def test_canonical_json__different_values_differ() -> None:
    assert canonical_json({"amount_cents": 4500}) != canonical_json({"amount_cents": 450})
    assert canonical_json(0.1) != canonical_json(0.1000001)
    assert canonical_json("1") != canonical_json(1)
    assert canonical_json(True) != canonical_json(1)
    assert canonical_json([1, 2]) != canonical_json([2, 1])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"x": float("nan")}, r"\$\.x: nan is not a JSON number"),
        ([float("inf")], r"\$\[0\]: inf"),
        ({1: "a"}, r"object keys must be strings, got 1"),
        ({"s": {1, 2}}, r"\$\.s: set is not a JSON value"),
        (10**400, "too large"),
    ],
)
def test_canonical_json__refuses_what_has_no_json_form(value: object, message: str) -> None:
    with pytest.raises(NotCanonicalError, match=message):
        canonical_json(value)


def test_normalise__gives_the_value_its_text_stands_for() -> None:
    assert normalise({"a": (1.0, -0.0, 2.5)}) == {"a": [1, 0, 2.5]}
    assert type(normalise(1.0)) is int


def test_canonical_json__same_text_in_another_process() -> None:
    """Another interpreter, another hash seed: the text (and so the digest) is the same."""
    script = (
        "import json, sys; from agentflow._base.canonical import canonical_json; "
        "print(canonical_json(json.loads(sys.stdin.read())))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps(VALUE),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
    )
    assert result.stdout.strip() == canonical_json(VALUE)
