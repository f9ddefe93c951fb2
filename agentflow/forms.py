"""The operator's reason for Retry and Cancel: required, because it is the audit trail (I6)."""

from __future__ import annotations

from django import forms

REASON_MAX_CHARS = 1000


class ReasonForm(forms.Form):
    """Asked on every operator action; the reason is stored on the run's event with the user."""

    reason = forms.CharField(
        max_length=REASON_MAX_CHARS,
        strip=True,
        widget=forms.Textarea(
            attrs={
                "rows": 3,
                "cols": 70,
                "placeholder": "e.g. Stripe shows no payment for this key (ticket #1234)",
            }
        ),
        help_text="Recorded in each run's event log together with your username.",
    )
