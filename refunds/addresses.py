"""Whether an e-mail address can be written into an SMTP envelope and header at all.

Django's EmailField accepts international domains, and some of them cannot be encoded (IDNA
rejects empty or over-long labels, bidi controls, line and paragraph separators). Refused in
the form, such an address never reaches a run; refused in the mailer, the send fails for good
instead of being retried for minutes, since trying again cannot encode it either.
"""

from __future__ import annotations

import unicodedata
from email.errors import HeaderParseError
from email.headerregistry import Address

#: Bidirectional controls: they make an address read differently from what it is.
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
#: Unicode categories no address may hold: controls, format characters, line/paragraph breaks.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def smtp_problem(address: str) -> str | None:
    """None if `address` can be sent to; otherwise why not, in words for the customer."""
    if any(ch in _BIDI_CONTROLS for ch in address):
        return "That email address contains hidden direction marks; please type it again."
    if any(unicodedata.category(ch) in _FORBIDDEN_CATEGORIES for ch in address):
        return "That email address contains hidden characters; please type it again."
    try:
        # What Django's mailer does with it (the address parsed, its domain IDNA-encoded),
        # through the standard library's API: Django 6.1 deprecates its own.
        Address(addr_spec=address).domain.encode("idna")
    except (ValueError, IndexError, HeaderParseError, UnicodeError):  # UnicodeError: IDNA
        return "We can't send email to that address; please check the part after the @."
    return None
