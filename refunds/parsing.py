"""Reads what the customer wants from their own words: flight, date and intent.

Deterministic (regular expressions and a keyword table), so a replayed step gets the same answer.
An LLM may later sit behind `parse_request`; it stays the single entry point.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import asdict, dataclass, field
from datetime import date, timedelta
from typing import Any

INTENTS = ("rebook", "cancel", "refund", "unknown")

#: Keyword stems per intent, matched at word starts. When scores tie, earlier wins: a customer
#: who says "cancel and rebook" wants a new flight, and "cancel and refund" wants money back.
_INTENT_KEYWORDS: dict[str, tuple[str, ...]] = {
    "rebook": (
        "rebook",
        "re-book",
        "reschedul",
        "re-schedul",
        "change",
        "move",
        "switch",
        "swap",
        "transfer",
        "postpone",
        "different flight",
        "another flight",
        "later flight",
        "earlier flight",
        "next flight",
        "new flight",
        "instead",
    ),
    "refund": (
        "refund",
        "money back",
        "reimburs",
        "repay",
        "chargeback",
        "my money",
        "compensat",
    ),
    "cancel": (
        "cancel",
        "can't make it",
        "cant make it",
        "cannot make it",
        "can not make it",
        "won't be flying",
        "not flying",
        "drop my",
        "call off",
    ),
}
_NEGATIONS = re.compile(r"\b(?:don'?t|do not|not|no|never|without|nor)\s+(?:\w+\s+){0,2}$")

_MONTHS = {
    name: number
    for number, names in enumerate(
        [
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sept", "sep"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ],
        start=1,
    )
    for name in names
}
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"(?P<year>\d{4})"

_DATE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern, re.IGNORECASE))
    for kind, pattern in (
        ("iso", r"\b(?P<year>\d{4})-(?P<month>\d{1,2})-(?P<day>\d{1,2})\b"),
        # 14.03.2025 is European, day first.
        ("dotted", r"\b(?P<day>\d{1,2})\.(?P<month>\d{1,2})\.(?P<year>\d{4}|\d{2})\b"),
        ("slashed", r"\b(?P<a>\d{1,2})/(?P<b>\d{1,2})(?:/(?P<year>\d{4}|\d{2}))?\b"),
        ("day_month", rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}(?:,?\s+{_YEAR})?\b"),
        ("month_day", rf"\b{_MONTH}\s+{_DAY}(?:,?\s+{_YEAR})?\b"),
        ("relative", r"\b(?P<word>today|tomorrow|day after tomorrow)\b"),
        ("weekday", r"\b(?P<next>next|this|on)\s+(?P<weekday>" + "|".join(_WEEKDAYS) + r")\b"),
    )
)

#: An IATA designator (two characters, at least one a letter) and a 1-4 digit number.
_FLIGHT = re.compile(r"\b(?P<code>[A-Za-z0-9]{2})(?P<sep>[ -]?)(?P<number>\d{1,4})\b")
_FLIGHT_CUE = re.compile(r"\bflight\s*(?:no\.?|number|nr\.?|#)?\s*:?\s*(?:is\s+)?$", re.IGNORECASE)
#: Short words that look like a designator when followed by a number ("TO 1400", "ON 12").
_NOT_AIRLINES = frozenset(
    {
        "AM",
        "AN",
        "AS",
        "AT",
        "BE",
        "BY",
        "DO",
        "GO",
        "HI",
        "IF",
        "IN",
        "IS",
        "IT",
        "ME",
        "MY",
        "NO",
        "OF",
        "OK",
        "ON",
        "OR",
        "PM",
        "SO",
        "TO",
        "UP",
        "US",
        "WE",
    }
)
_REFERENCE = re.compile(r"\b[A-Za-z0-9]{6}\b")
_REFERENCE_CUE = re.compile(
    r"\b(?:booking|reference|ref|pnr|confirmation|record locator|code)\b[\s:#.-]*(?:is\s+)?$",
    re.IGNORECASE,
)
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"), None)


@dataclass(frozen=True, kw_only=True)
class ParsedRequest:
    booking_reference: str
    #: The flight the customer names (the last one, e.g. the one they want to move to).
    flight: str | None
    #: ISO date, or None when the message gives none we can read.
    date: str | None
    intent: str
    summary: str
    notes: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["notes"] = list(self.notes)
        return data


def parse_request(
    message: str, booking_reference: str, *, today: date | None = None
) -> ParsedRequest:
    """Read the customer's message. The form's booking reference always wins over the text.

    `today` anchors dates without a year and words like "tomorrow"; pass the request's
    submission date so that parsing the same request again gives the same answer.
    """
    today = today or date.today()
    reference = booking_reference.strip().upper()
    text = _normalise(message)
    notes: list[str] = []

    mentioned = [r for r in _references_in(text) if r != reference]
    if mentioned:
        notes.append(f"message mentions booking {mentioned[0]}; using {reference} from the form")
    flights = _flights_in(text, exclude={reference, *mentioned})
    dates = _dates_in(text, today, notes)
    if len(dates) > 1:
        notes.append(f"{len(dates)} dates mentioned; using the last")
    intent = _intent_of(text)
    flight = flights[-1] if flights else None
    when = dates[-1].isoformat() if dates else None
    return ParsedRequest(
        booking_reference=reference,
        flight=flight,
        date=when,
        intent=intent,
        summary=_summary(intent, flight, when),
        notes=tuple(notes),
    )


def _normalise(message: str) -> str:
    text = unicodedata.normalize("NFKC", message or "").translate(_INVISIBLE)
    text = text.replace("\u2019", "'").replace("\u2018", "'")
    text = re.sub(r"[\u2010-\u2015]", "-", text)
    return re.sub(r"\s+", " ", text).strip()[:5000]


def _references_in(text: str) -> list[str]:
    """Six-character codes the customer calls a booking, or that cannot be a flight number."""
    found: list[str] = []
    for match in _REFERENCE.finditer(text):
        token = match.group(0)
        if not (re.search(r"\d", token) and re.search(r"[A-Za-z]", token)):
            continue  # plain words and numbers are not references
        cued = bool(_REFERENCE_CUE.search(text[max(0, match.start() - 30) : match.start()]))
        looks_like_flight = bool(re.fullmatch(r"[A-Za-z]{2}\d{4}", token))
        if (cued or (token.isupper() and not looks_like_flight)) and token.upper() not in found:
            found.append(token.upper())
    return found


def _flights_in(text: str, *, exclude: set[str]) -> list[str]:
    found: list[str] = []
    for match in _FLIGHT.finditer(text):
        code, sep, number = match.group("code"), match.group("sep"), match.group("number")
        if not re.search(r"[A-Za-z]", code):
            continue
        flight = f"{code.upper()}{number}"
        if flight in exclude:
            continue
        if code.upper() in _NOT_AIRLINES and (sep or not code.isupper()):
            continue  # a short word followed by a number: "on 12 March", "TO 1400"
        cued = bool(_FLIGHT_CUE.search(text[max(0, match.start() - 24) : match.start()]))
        # Without the word "flight", only an upper-case code counts ("SK1234", "SK 123").
        if not cued and (not code.isupper() or len(number) < 2 or _is_time(text, match)):
            continue
        found.append(flight)
    return found


def _is_time(text: str, match: re.Match[str]) -> bool:
    """ "AT 10:30" or "PM 12.15": digits go on after a separator, so it is not a flight."""
    after = text[match.end() : match.end() + 2]
    return len(after) == 2 and after[0] in ":.," and after[1].isdigit()


def _dates_in(text: str, today: date, notes: list[str]) -> list[date]:
    """Every readable date, in order of appearance (overlapping matches count once)."""
    hits: list[tuple[int, int, date]] = []
    for kind, pattern in _DATE_PATTERNS:
        for match in pattern.finditer(text):
            if any(start < match.end() and match.start() < end for start, end, _ in hits):
                continue
            found = _to_date(kind, match, today, notes)
            if found is not None:
                hits.append((match.start(), match.end(), found))
    return [found for _, _, found in sorted(hits, key=lambda hit: hit[0])]


def _to_date(kind: str, match: re.Match[str], today: date, notes: list[str]) -> date | None:
    groups = match.groupdict()
    if kind == "relative":
        word = groups["word"].lower()
        return today + timedelta(days={"today": 0, "tomorrow": 1}.get(word, 2))
    if kind == "weekday":
        target = _WEEKDAYS.index(groups["weekday"].lower())
        ahead = (target - today.weekday()) % 7
        if groups["next"].lower() == "next" and ahead == 0:
            ahead = 7
        return today + timedelta(days=ahead)
    if kind == "slashed":
        first, second = int(groups["a"]), int(groups["b"])
        if first > 12:
            day, month = first, second
        elif second > 12:
            month, day = first, second
        else:
            # Fees are in dollars, so an ambiguous 03/04 reads the US way: month first.
            month, day = first, second
            if first != second:
                notes.append(f"read {match.group(0)} as month/day")
    elif kind in ("day_month", "month_day"):
        month, day = _MONTHS[groups["month"].lower()], int(groups["day"])
    else:
        month, day = int(groups["month"]), int(groups["day"])
    year_text = groups.get("year")
    if year_text:
        year = int(year_text) + (2000 if len(year_text) == 2 else 0)
        return _safe_date(year, month, day)
    return _next_occurrence(month, day, today)


def _safe_date(year: int, month: int, day: int) -> date | None:
    try:
        return date(year, month, day)
    except ValueError:
        return None  # "31/02" and friends: not a date, so not a guess either


def _next_occurrence(month: int, day: int, today: date) -> date | None:
    """A date without a year: this year's, unless that was more than a week ago."""
    this_year = _safe_date(today.year, month, day)
    if this_year is not None and this_year >= today - timedelta(days=7):
        return this_year
    return _safe_date(today.year + 1, month, day)


def _intent_of(text: str) -> str:
    lowered = text.lower()
    scores = dict.fromkeys(_INTENT_KEYWORDS, 0)
    for intent, keywords in _INTENT_KEYWORDS.items():
        for keyword in keywords:
            for match in re.finditer(r"\b" + re.escape(keyword), lowered):
                if not _NEGATIONS.search(lowered[max(0, match.start() - 40) : match.start()]):
                    scores[intent] += 1
    best = max(scores.values())
    if best == 0:
        return "unknown"
    return next(intent for intent in _INTENT_KEYWORDS if scores[intent] == best)


def _summary(intent: str, flight: str | None, when: str | None) -> str:
    words = {"rebook": "rebook", "cancel": "cancel", "refund": "refund", "unknown": "request"}
    parts = [words[intent]]
    if flight:
        parts.append(flight)
    if when:
        parts.append(f"on {when}")
    if not flight and not when:
        parts.append("(no flight or date given)")
    return " ".join(parts)
