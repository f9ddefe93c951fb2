"""The customer's rebooking form and its signed one-time submission token."""

from __future__ import annotations

import re
import secrets

from django import forms
from django.core import signing
from django.core.validators import RegexValidator

from refunds import policy
from refunds.addresses import smtp_problem

#: Long enough to fill in a form at leisure, short enough that an old tab is not replayed.
TOKEN_MAX_AGE_SECONDS = 2 * 3600
TOKEN_SALT = "refunds.submission-token"
#: What a nonce looks like once unsigned: 32 URL-safe characters (192 random bits).
_NONCE_RE = re.compile(r"^[A-Za-z0-9_-]{32}$")
MESSAGE_MAX_CHARS = 5000
LAST_NAME_MAX_CHARS = 100


def new_submission_token() -> str:
    """A fresh signed token for one rendering of the form."""
    return signing.TimestampSigner(salt=TOKEN_SALT).sign(secrets.token_urlsafe(24))


def unsign_submission_token(value: str) -> str | None:
    """The nonce inside a genuine, unexpired token, else None (tampered, expired, missing).

    The nonce, not the signed text, is stored: one form rendering maps to one refund.
    """
    if not value or len(value) > 200:
        return None
    try:
        nonce = signing.TimestampSigner(salt=TOKEN_SALT).unsign(
            value, max_age=TOKEN_MAX_AGE_SECONDS
        )
    except signing.BadSignature:  # SignatureExpired is a subclass
        return None
    return nonce if _NONCE_RE.match(nonce) else None


class BookingReferenceField(forms.CharField):
    """Upper-cased before validation, so 'abc123' is as good as 'ABC123'."""

    def to_python(self, value: object) -> str:
        return (super().to_python(value) or "").upper()


class MessageField(forms.CharField):
    """Browsers send line breaks as CRLF but count them as one character; so do we."""

    def to_python(self, value: object) -> str:
        return (super().to_python(value) or "").replace("\r\n", "\n")

    def widget_attrs(self, widget: forms.Widget) -> dict[str, str]:
        """No `maxlength`: it silently cuts pasted text; a counter and our error say it instead."""
        attrs = super().widget_attrs(widget)
        attrs.pop("maxlength", None)
        attrs["data-max-chars"] = str(self.max_length)
        return attrs


#: The first choice: most requests ask for no waiver.
NO_WAIVER = ("", "No, I'm not asking for that")


class RefundRequestForm(forms.Form):
    """Booking reference, the passenger's last name, the booking's e-mail and their words, and
    optionally a fee waiver: one of the policy's reasons, with a few words about it.

    The name and e-mail are checked against the airline's booking before anything changes
    (refunds.ownership): whoever knows a reference is not thereby its owner.
    """

    booking_reference = BookingReferenceField(
        label="Booking reference",
        max_length=40,  # longer input still gets the friendly shape message below
        help_text="6 letters and numbers, on your booking confirmation (for example ABC123).",
        validators=[
            RegexValidator(
                r"^[A-Z0-9]{6}\Z",
                message="A booking reference is exactly 6 letters and numbers, like ABC123.",
            )
        ],
        error_messages={
            "required": "Enter your booking reference.",
            "max_length": "A booking reference is exactly 6 letters and numbers, like ABC123.",
        },
        widget=forms.TextInput(
            attrs={
                "autocomplete": "off",
                "autocapitalize": "characters",
                "spellcheck": "false",
                "size": "8",
            }
        ),
    )
    last_name = forms.CharField(
        label="Passenger's last name",
        max_length=LAST_NAME_MAX_CHARS,
        help_text="As on the booking. Capitals, accents and spaces don't matter.",
        error_messages={
            "required": "Enter the passenger's last name.",
            "max_length": "That name is longer than we can check; please shorten it.",
        },
        widget=forms.TextInput(attrs={"autocomplete": "family-name", "spellcheck": "false"}),
    )
    email = forms.EmailField(
        label="Email address",
        max_length=254,
        help_text="The one on your booking: we only ever write to the address on file.",
        error_messages={
            "required": "Enter your email address.",
            "invalid": "Enter an email address like name@example.com.",
            "max_length": "That email address is too long to be real; please check it.",
        },
        widget=forms.EmailInput(attrs={"autocomplete": "email", "spellcheck": "false"}),
    )
    message = MessageField(
        label="What would you like to change?",
        max_length=MESSAGE_MAX_CHARS,
        help_text="In your own words: the flight you'd like instead, dates, anything we should "
        "know. Up to 5,000 characters.",
        error_messages={
            "required": "Tell us what you'd like to change.",
            "max_length": "Please keep your message to 5,000 characters or fewer "
            "(it has %(show_value)d).",
        },
        widget=forms.Textarea(attrs={"rows": 7}),
    )
    waiver_reason = forms.ChoiceField(
        label="Ask us to waive the change fee?",
        required=False,
        choices=[NO_WAIVER, *policy.WAIVER_REASONS.items()],
        help_text="We waive the fee for these reasons only. A person on our team decides "
        "before anything on your booking changes, usually within a day (at most 48 hours).",
        error_messages={"invalid_choice": "Choose one of the reasons in the list."},
    )
    waiver_details = MessageField(
        label="What happened?",
        required=False,
        max_length=policy.WAIVER_DETAILS_MAX_CHARS,
        help_text="Only if you ask for a waiver: a few words for our team, for example the "
        "date and who was affected. Up to 1,000 characters.",
        error_messages={
            "max_length": "Please keep this to 1,000 characters or fewer (it has %(show_value)d).",
        },
        widget=forms.Textarea(attrs={"rows": 3}),
    )
    submission_token = forms.CharField(
        widget=forms.HiddenInput, required=False, max_length=200, strip=True
    )

    def clean_email(self) -> str:
        """Lower-case the domain only: the part before @ is the mailbox owner's business.
        An address that cannot be encoded for SMTP is refused here, not by a failing run."""
        local, _, domain = self.cleaned_data["email"].rpartition("@")
        address = f"{local}@{domain.lower()}"
        problem = smtp_problem(address)
        if problem:
            raise forms.ValidationError(problem, code="unsendable")
        return address

    def clean_last_name(self) -> str:
        """Inner runs of spaces become one; a name must hold at least one letter."""
        name = " ".join(self.cleaned_data["last_name"].split())
        if not any(ch.isalpha() for ch in name):
            raise forms.ValidationError("Enter the passenger's last name.", code="no_letters")
        return name

    def clean(self) -> dict[str, object]:
        """A waiver needs both its reason and a few words about it; either alone is a field
        error on the other, so nothing typed is dropped or silently ignored."""
        data = super().clean()
        reason = data.get("waiver_reason", "")
        details = (data.get("waiver_details") or "").strip()
        if "waiver_details" in data:
            data["waiver_details"] = details
        if reason and "waiver_details" in data and not details:
            self.add_error(
                "waiver_details",
                forms.ValidationError(
                    "Tell us briefly what happened, so our team can decide.", code="required"
                ),
            )
        if details and "waiver_reason" in data and not reason:
            self.add_error(
                "waiver_reason",
                forms.ValidationError(
                    "Choose the reason for the waiver, or empty the box below if you are not "
                    "asking for one.",
                    code="required",
                ),
            )
        return data
