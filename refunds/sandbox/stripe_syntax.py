"""Stripe's wire syntax: bracketed form encoding and the search query language (a subset)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl

SEARCH_FIELDS = frozenset({"status", "currency", "amount"})
# One clause: `metadata['key']:'value'` or `field:'value'` / `field:value`; quotes escape with `\`.
_CLAUSE = re.compile(
    r"""(?:metadata\[(?P<q1>['"])(?P<mkey>.+?)(?P=q1)\]|(?P<field>[a-z_]+))\s*:\s*"""
    r"""(?:'(?P<single>(?:\\.|[^'\\])*)'|"(?P<double>(?:\\.|[^"\\])*)"|(?P<bare>[\w.-]+))"""
)
_AND = re.compile(r"\s+AND\s+")


def decode_form(raw: str) -> dict[str, Any]:
    """Stripe's form encoding: `metadata[k]=v` nests; `expand[0]=x` and `expand[]=x` are lists."""
    result: dict[str, Any] = {}
    for name, value in parse_qsl(raw, keep_blank_values=True):
        match = re.fullmatch(r"([^\[\]]+)((?:\[[^\[\]]*\])*)", name)
        if match is None:
            raise ValueError(f"Invalid parameter name: {name}")
        keys = [match.group(1), *re.findall(r"\[([^\[\]]*)\]", match.group(2))]
        node: Any = result
        for index, key in enumerate(keys):
            last = index == len(keys) - 1
            if isinstance(node, list):
                node.append(value if last else {})
                node = node[-1]
            elif last:
                node[key] = value
            else:
                node = node.setdefault(key, [] if keys[index + 1] == "" else {})
    return _lists_from_indexes(result)


def _lists_from_indexes(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    node = {key: _lists_from_indexes(value) for key, value in node.items()}
    if node and all(key.isdigit() for key in node):
        return [node[key] for key in sorted(node, key=int)]
    return node


def parse_query(query: str) -> list[tuple[str | None, str | None, str]]:
    """(metadata key, field, value) per clause; ValueError on anything the sandbox cannot do."""
    clauses, position = [], 0
    while True:
        match = _CLAUSE.match(query, position)
        if match is None or (match["field"] and match["field"] not in SEARCH_FIELDS):
            raise ValueError(query[position:])
        quoted = match["single"] if match["single"] is not None else match["double"]
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else match["bare"]
        clauses.append((match["mkey"], match["field"], value))
        position = match.end()
        if position == len(query):
            return clauses
        separator = _AND.match(query, position)
        if separator is None:
            raise ValueError(query[position:])
        position = separator.end()
