"""The customer's free text: flights, dates in many shapes, intents, and the form's reference."""

from __future__ import annotations

from datetime import date

import pytest

from refunds.parsing import ParsedRequest, parse_request

TODAY = date(2025, 3, 1)  # a Saturday


def parse(message: str, reference: str = "ABC123") -> ParsedRequest:
    return parse_request(message, reference, today=TODAY)


@pytest.mark.parametrize(
    ("message", "flight"),
    [
        ("Please move me to SK1234", "SK1234"),
        ("I'm on SK 123 tomorrow", "SK123"),
        ("flight number: lh400, can I change it?", "LH400"),
        ("my flight is u2 8021", "U28021"),
        ("Flight #BA-117 please", "BA117"),
        ("I was booked on SK1234 but want SK1240 instead", "SK1240"),
    ],
)
def test_parse__reads_flight_numbers(message: str, flight: str) -> None:
    assert parse(message).flight == flight


@pytest.mark.parametrize(
    "message",
    [
        "MY FLIGHT AT 10:30 IS TOO EARLY, MOVE ME TO 1400 PLEASE",
        "I land on 12 March with 2 bags",
        "call me at 555 1234",
        "2025-03-14 please",
        "",
    ],
)
def test_parse__ignores_words_and_numbers_that_only_look_like_flights(message: str) -> None:
    assert parse(message).flight is None


@pytest.mark.parametrize(
    ("message", "iso"),
    [
        ("on 2025-03-14", "2025-03-14"),
        ("on 14.03.2025", "2025-03-14"),
        ("on 14/03/2025", "2025-03-14"),
        ("on 03/14/2025", "2025-03-14"),
        ("on 3/14", "2025-03-14"),
        ("on 14 March", "2025-03-14"),
        ("on the 14th of march, 2025", "2025-03-14"),
        ("on Mar. 14th", "2025-03-14"),
        ("on March 14 2026", "2026-03-14"),
        ("tomorrow", "2025-03-02"),
        ("the day after tomorrow", "2025-03-03"),
        ("next friday", "2025-03-07"),
        ("next saturday", "2025-03-08"),
        ("on 2 January", "2026-01-02"),  # already past this year: next year's
        ("on 26 February", "2025-02-26"),  # a few days ago: still this year's
    ],
)
def test_parse__reads_dates_in_many_formats(message: str, iso: str) -> None:
    assert parse(message).date == iso


def test_parse__ambiguous_slashed_date_reads_month_first_and_says_so() -> None:
    parsed = parse("can you move me to 03/04")
    assert parsed.date == "2025-03-04"
    assert "read 03/04 as month/day" in parsed.notes


def test_parse__impossible_date_is_not_guessed() -> None:
    assert parse("rebook me for 31/02/2025").date is None


def test_parse__several_dates_uses_the_last_and_notes_it() -> None:
    parsed = parse("My flight on 14 March was cancelled, please put me on March 16th")
    assert parsed.date == "2025-03-16"
    assert "2 dates mentioned; using the last" in parsed.notes


@pytest.mark.parametrize(
    ("message", "intent"),
    [
        ("Please rebook me on a later flight", "rebook"),
        ("can I change my flight to friday?", "rebook"),
        ("Cancel my booking and rebook me tomorrow", "rebook"),
        ("I want my money back, the flight was cancelled. REFUND NOW", "refund"),
        ("please cancel, I can't make it", "cancel"),
        ("I do not want a refund, just move me to friday", "rebook"),
        ("hello??? is anyone there", "unknown"),
    ],
)
def test_parse__intent_from_keywords(message: str, intent: str) -> None:
    assert parse(message).intent == intent


def test_parse__form_reference_wins_over_one_in_the_message() -> None:
    parsed = parse("booking ref: xyz789, please move me to SK1240", reference="abc123")
    assert parsed.booking_reference == "ABC123"
    assert parsed.flight == "SK1240"
    assert "message mentions booking XYZ789; using ABC123 from the form" in parsed.notes


def test_parse__form_reference_in_the_message_is_neither_a_flight_nor_a_conflict() -> None:
    parsed = parse("Booking SK1234: please move me to SK1240", reference="SK1234")
    assert parsed.flight == "SK1240"
    assert parsed.notes == ()


def test_parse__messy_text_with_odd_spacing_and_unicode() -> None:
    message = (
        "Hi!!\n\n  my\u00a0flight\u200b SK\u00a01234   on   Mar\u00a014 \u2014 "
        "can\u2019t make it, pls CHANGE"
    )
    parsed = parse(message)
    assert (parsed.flight, parsed.date, parsed.intent) == ("SK1234", "2025-03-14", "rebook")


def test_parse__summary_is_a_few_words() -> None:
    assert parse("rebook me to SK1240 on 2025-03-16").summary == "rebook SK1240 on 2025-03-16"
    assert parse("help").summary == "request (no flight or date given)"


def test_parse__same_input_same_answer_as_json() -> None:
    message = "change SK1234 to next friday"
    assert parse(message).as_dict() == parse(message).as_dict()
    assert parse(message).as_dict()["notes"] == []
