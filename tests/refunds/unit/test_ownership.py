"""The ownership check: a pure comparison of what was typed with the booking on file."""

from __future__ import annotations

import pytest

from refunds import ownership

BOOKED = {"passenger_last_name": "Åberg-Lindqvist", "contact_email": "Elena.Aberg@Example.com"}


def owns(last_name: str, email: str, **booked: str) -> bool:
    return ownership.is_owner(last_name=last_name, email=email, **{**BOOKED, **booked})


@pytest.mark.parametrize(
    "typed",
    [
        "Åberg-Lindqvist",
        "aberg-lindqvist",
        "ABERG LINDQVIST",
        "  åberg  lindqvist ",
        "AbergLindqvist",
    ],
)
def test_is_owner__case_accents_and_spacing_are_ignored(typed: str) -> None:
    assert owns(typed, "elena.aberg@example.com")


@pytest.mark.parametrize(
    ("typed", "booked"),
    [("Sorensen", "Sørensen"), ("Strasse", "Straße"), ("Lukasiewicz", "Łukasiewicz")],
)
def test_is_owner__letters_without_a_decomposition_match_their_ascii_spelling(
    typed: str, booked: str
) -> None:
    assert owns(typed, "elena.aberg@example.com", passenger_last_name=booked)


def test_is_owner__email_case_and_international_domain_form_are_ignored() -> None:
    assert owns("Aberg-Lindqvist", "ELENA.ABERG@EXAMPLE.COM")
    assert owns("x", "ana@bücher.de", passenger_last_name="x", contact_email="ana@xn--bcher-kva.de")


@pytest.mark.parametrize(
    ("last_name", "email"),
    [
        pytest.param("Aberg", "elena.aberg@example.com", id="part-of-the-surname"),
        pytest.param("Lindqvist-Aberg", "elena.aberg@example.com", id="other-order"),
        pytest.param("Aberg-Lindqvist", "elena.aberg@example.org", id="other-domain"),
        pytest.param("Aberg-Lindqvist", "elena.aberg+x@example.com", id="other-mailbox"),
        pytest.param("", "elena.aberg@example.com", id="no-surname"),
        pytest.param("--", "elena.aberg@example.com", id="punctuation-only"),
        pytest.param("Aberg-Lindqvist", "", id="no-email"),
    ],
)
def test_is_owner__any_difference_is_a_mismatch(last_name: str, email: str) -> None:
    assert not owns(last_name, email)


def test_is_owner__a_booking_without_a_contact_matches_nobody() -> None:
    assert not owns("Aberg-Lindqvist", "", contact_email="")
    assert not owns("", "elena.aberg@example.com", passenger_last_name="")


def test_mismatch__one_message_that_names_no_detail() -> None:
    assert ownership.MISMATCH == "These details don't match a booking."
