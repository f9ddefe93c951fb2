"""What an operator action asks: the reason, required because it is the audit trail (I6), and for
Approve and Reject of a call that declares `Replies`, what the customer is told, apart from it."""

from __future__ import annotations

from typing import Any

from django import forms

from agentflow._core.replies import REPLY_MAX_CHARS, Replies, own_words

REASON_MAX_CHARS = 1000
#: The choice that takes the operator's own words for the customer instead of a sentence.
OWN_WORDS = "__own_words__"


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


class DecisionForm(ReasonForm):
    """Approve or Reject. The reason stays internal; when the call declares what its decision may
    tell the customer (`replies`), the operator picks one of those sentences or writes their own,
    in a field of its own, and confirms after a preview of exactly those words (`confirmed`)."""

    reply = forms.ChoiceField(
        label="Told to the customer",
        widget=forms.RadioSelect,
        help_text="Exactly these words reach the customer, on their status page and in their "
        "e-mail. Your reason and your name never do.",
    )
    own_words = forms.CharField(
        label="Your words to the customer",
        required=False,
        max_length=REPLY_MAX_CHARS,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
        help_text="Only if you chose to write your own: plain words for the customer, shown "
        "to you in a preview before anything is decided.",
    )
    #: Set by the preview page: the operator saw the customer's words and confirms them.
    confirmed = forms.BooleanField(required=False, widget=forms.HiddenInput)

    def __init__(
        self, data: Any = None, *, replies: Replies | None, approved: bool, **kwargs: Any
    ) -> None:
        super().__init__(data, **kwargs)
        reason = self.fields["reason"]
        reason.help_text = (
            "Internal: recorded in the run's event log with your username, for your team. "
            "It is never shown to the customer."
        )
        reason.widget.attrs["placeholder"] = "Why you decided so, for the audit trail"
        self.replies = replies
        if replies is None:  # the call tells nobody anything: the reason alone
            for name in ("reply", "own_words", "confirmed"):
                del self.fields[name]
            return
        offered = replies.offered(approved=approved)
        choices = [(sentence, sentence) for sentence in offered]
        if replies.own_words:
            choices.append((OWN_WORDS, "In my own words (below)"))
        else:
            del self.fields["own_words"]
        field = self.fields["reply"]
        assert isinstance(field, forms.ChoiceField)
        field.choices = choices
        field.initial = offered[0]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("reply") == OWN_WORDS and not own_words(data.get("own_words") or ""):
            self.add_error(
                "own_words",
                forms.ValidationError(
                    "Write what the customer is told, or choose one of the sentences.",
                    code="required",
                ),
            )
        return data

    @property
    def asks_reply(self) -> bool:
        return self.replies is not None

    @property
    def reply_text(self) -> str:
        """The words the customer is told ("" when the call declares none): valid forms only."""
        if self.replies is None:
            return ""
        chosen = self.cleaned_data["reply"]
        if chosen == OWN_WORDS:
            return own_words(self.cleaned_data.get("own_words") or "")
        return str(chosen)

    @property
    def ready(self) -> bool:
        """Valid, and either nothing to preview or the preview confirmed."""
        return self.is_valid() and (self.replies is None or bool(self.cleaned_data["confirmed"]))
