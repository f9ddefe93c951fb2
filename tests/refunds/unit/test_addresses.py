"""Addresses that cannot be written into an SMTP envelope are caught before any send."""

from __future__ import annotations

import pytest

from refunds.addresses import smtp_problem


@pytest.mark.parametrize(
    "address", ["ana@example.com", "ana.lopez+trip@example.co.uk", "ana@bücher.de"]
)
def test_smtp_problem__sendable_addresses_pass(address: str) -> None:
    assert smtp_problem(address) is None


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("ana@exa\u200fmple.com", "direction marks"),
        ("ana@exa\u202emple.com", "direction marks"),
        ("ana@ex\u2028ample.com", "hidden characters"),
        ("ana@ex\u2029ample.com", "hidden characters"),
        ("ana@ex\u00adample.com", "hidden characters"),
        ("ana@\u3002example.com", "part after the @"),
        ("ana@" + "ü" * 70 + ".com", "part after the @"),
    ],
)
def test_smtp_problem__unencodable_addresses_are_named(address: str, words: str) -> None:
    problem = smtp_problem(address)
    assert problem and words in problem
