"""Whether a request comes from the booking's owner: the passenger's last name and the contact
e-mail on file, as airlines check "booking reference + surname".

A pure function, so every way of running a refund asks the same question in code before
anything happens: the graph workflow's `verify_owner` step, and an agent before its model is
first asked. The answer is yes or no, never which detail was wrong: telling "right surname,
wrong e-mail" apart would let anyone holding a reference guess the rest one detail at a time.
"""

from __future__ import annotations

import contextlib
import unicodedata

#: The one answer to every mismatch, an unknown reference included.
MISMATCH = "These details don't match a booking."

#: Letters that do not decompose into a base letter and an accent, spelled as travel documents
#: spell them in ASCII (ICAO 9303), so "Sørensen" matches "Sorensen".
_TRANSLITERATE = str.maketrans(
    {"ø": "o", "æ": "ae", "œ": "oe", "ł": "l", "đ": "d", "ð": "d", "þ": "th", "\u0131": "i"}
)


def normalise_name(name: str) -> str:
    """Case, accents, spaces and punctuation ignored: ' Da-Silva ' and 'dasilva' are one name."""
    folded = unicodedata.normalize("NFKD", name.casefold().translate(_TRANSLITERATE))
    return "".join(ch for ch in folded if ch.isalnum())


def normalise_email(address: str) -> str:
    """Compared without case, and with an international domain in its ASCII (IDNA) form."""
    local, _, domain = address.strip().rpartition("@")
    # Not encodable: compared as typed, so it simply will not match.
    with contextlib.suppress(UnicodeError):
        domain = domain.encode("idna").decode("ascii")
    return f"{local}@{domain}".casefold()


def is_owner(*, last_name: str, email: str, passenger_last_name: str, contact_email: str) -> bool:
    """True only if both the last name and the e-mail match the booking's."""
    given_name, booked_name = normalise_name(last_name), normalise_name(passenger_last_name)
    if not given_name or not booked_name or not contact_email.strip():
        return False
    return given_name == booked_name and normalise_email(email) == normalise_email(contact_email)
