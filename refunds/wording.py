"""Every sentence a customer reads, in one place: the status page, `status.json`'s `customer` and
the e-mails build their words from these and from nothing else.

Sentences are written for customers, per outcome and per step. Some take facts (a flight, a date,
a fee), each of a kind whose shape is fixed (`FACTS`): a fact that does not have that shape is
not said, so no partner's text, step error or output, operator's reason or name can reach a
customer through one. A step's failure reaches them as the sentence that failure was written
as (`failure`): a domain error recognised as one of `FAILURES`, rebuilt from its facts, else the
step's own plain sentence — never the error's text. What an operator tells the customer of a fee
waiver is one of the policy's sentences (`refunds.policy.WAIVER_REPLIES`) or words they typed in
the admin's field for the customer and saw in a preview (`waiver_reply`).

`catalogue()` lists every sentence, and `is_customer_text` says whether a text is made of them
alone: the suite renders every outcome and step failure the domain knows and checks with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import date
from string import Formatter

from refunds import policy

_DAYS = "Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday"
_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
#: The kinds of fact a sentence may carry, by field name, as regular expressions.
FACTS: Mapping[str, str] = {
    "fee": r"\$\d{1,3}(?:,\d{3})*(?:\.\d{2})?",
    "flight": r"[A-Z0-9]{2}[0-9]{1,4}",
    "date": rf"(?:{_DAYS}) \d{{1,2}} (?:{_MONTHS}) \d{{4}}",
    "last": rf"(?:{_DAYS}) \d{{1,2}} (?:{_MONTHS}) \d{{4}}",
    "seat": r"\d{1,3}[A-Z]",
    "reference": r"[A-Z0-9]{6}",
    "asked": r"\$\d{1,3}(?:,\d{3})*(?:\.\d{2})?",
    "within": (
        r"\d{1,3}\s(?:minutes?|hours?|days?|weeks?)(?:,\s\d{1,3}\s(?:minutes?|hours?|days?))?"
    ),
    "decline": (
        r"insufficient funds|expired card|incorrect cvc|incorrect number|card velocity exceeded"
    ),
    "missing": (
        r"(?:your seat was not changed|the change fee was not settled|no new boarding pass was "
        r"issued|no confirmation was sent)(?:; (?:your seat was not changed|the change fee was "
        r"not settled|no new boarding pass was issued|no confirmation was sent))*"
    ),
}


@dataclass(frozen=True)
class Sentence:
    """A sentence written for customers; `{fact}` fields take facts of the kinds in FACTS."""

    text: str

    @property
    def facts(self) -> tuple[str, ...]:
        return tuple(name for _, name, _, _ in Formatter().parse(self.text) if name)

    def say(self, **facts: str) -> str:
        """The sentence with its facts, or "" when one is missing or not of its kind."""
        for name in self.facts:
            if not re.fullmatch(FACTS[name], str(facts.get(name, ""))):
                return ""
        return self.text.format(**facts)

    @property
    def pattern(self) -> str:
        """A regular expression matching exactly what `say` can return."""
        return self._pattern(named=False)

    @property
    def recogniser(self) -> str:
        """`pattern`, its facts in groups named after them."""
        return self._pattern(named=True)

    def _pattern(self, *, named: bool) -> str:
        parts = []
        for literal, name, _, _ in Formatter().parse(self.text):
            parts.append(re.escape(literal))
            if name:
                parts.append(f"(?P<{name}>{FACTS[name]})" if named else f"(?:{FACTS[name]})")
        return "".join(parts)

    def __str__(self) -> str:
        return self.text


def date_in_words(iso: str) -> str:
    """'2027-03-16' -> 'Tuesday 16 March 2027'; anything else unchanged (and so, in a sentence,
    not said: it is not a date's shape)."""
    try:
        day = date.fromisoformat(iso)
    except (TypeError, ValueError):
        return str(iso or "")
    return f"{day:%A} {day.day} {day:%B %Y}"


def format_fee(cents: int) -> str:
    """'$45' for whole dollars, '$45.50' otherwise."""
    dollars, rest = divmod(cents, 100)
    return f"${dollars}" if rest == 0 else f"${dollars}.{rest:02d}"


# --- the status page's rows, one per step ------------------------------------------------------
#: Labels for every persisted step name; `{fee}` becomes the amount, e.g. "$45".
STEP_LABELS: Mapping[str, Sentence] = {
    name: Sentence(text)
    for name, text in {
        "load_request": "Receiving your request",
        "parse_flight_details": "Reading your request",
        "fetch_booking": "Finding your booking and checking your details",
        "check_flight": "Checking your new flight in the airline's schedule",
        "check_cancellation_policy": "Checking the fare rules",
        "request_fee_waiver": "Our team reviewing your fee waiver request",
        "calculate_penalty_fee": "Working out the fee",
        "charge_customer": "Securing the {fee} change fee on your card",
        "cancel_seat": "Releasing your seat",
        "issue_boarding_pass": "Issuing your new boarding pass",
        "capture_fee": "Taking the {fee} change fee",
        "update_crm": "Updating your file",
        "send_confirmation_email": "Emailing your confirmation",
        # Compensation: only shown once they start.
        "refund_fee": "Giving back the {fee} fee",
        "reinstate_seat": "Giving your seat back",
        "notify_failure": "Letting you know",
    }.items()
}
#: Fares that change for free (flex) have nothing to charge or refund.
NO_FEE_LABELS: Mapping[str, str] = {
    "request_fee_waiver": "No change fee to waive for your fare",
    "charge_customer": "No change fee for your fare",
    "capture_fee": "No change fee to take",
    "refund_fee": "No fee to give back",
}
#: A fee our team waived (refunds.waivers) has nothing to hold, take or give back either.
WAIVED_LABELS: Mapping[str, str] = {
    "charge_customer": "Change fee waived: nothing held on your card",
    "capture_fee": "Change fee waived: nothing to take",
    "refund_fee": "No fee to give back",
}
#: A step added later without a label must not show its internal name to customers.
GENERIC_LABEL = "Working on your request"
#: Row states, in customer words.
STATE_LABELS: Mapping[str, str] = {
    "done": "Done",
    "active": "In progress",
    "retrying": "Taking longer than usual, still trying",
    "failed": "Could not be completed",
    "pending": "Waiting",
    "awaiting": "Waiting for our team",
    "held": "On hold for our team",
    "skipped": "Not done",
}

# --- the headline and message of each outcome --------------------------------------------------
DONE = "All done — your new boarding pass is on its way"
DONE_SAID = "We've changed your booking and emailed your confirmation and new boarding pass."
REFUNDED = Sentence("We couldn't complete the change; the {fee} fee was refunded")
NOT_CHANGED = "Your original booking could not be changed."
REFUND_COMING = "The refund is on its way to your card."
REFUND_COMING_EMAILED = "The refund is on its way to your card and we've emailed you the details."
FAILED = "We couldn't complete the change"
NOT_CHARGED = "You have not been charged."
HOLD_GONE = "You have not been charged: the hold on your card was released."
TRY_AGAIN = "You're welcome to try again or contact us."
EMAILED_TRY_AGAIN = "We've emailed you; you're welcome to try again or contact us."
LOOKING = "A member of our team will look at this"
LOOKING_SAID = (
    "Something unusual happened, so a person will check your request and email you. "
    "You don't need to do anything."
)
STOPPED = "This request was stopped"
STOPPED_SAID = (
    "A member of our team stopped this request. If you didn't expect this, please contact us."
)
AWAITING = "Your fee waiver request is waiting for our team"
AWAITING_WITHIN = Sentence("A person on our team will look at your request within {within}.")
AWAITING_NOTHING_MOVES = (
    "Nothing on your booking or your card changes until then; this page updates by itself."
)
UNDOING = "Something went wrong, so we're putting things right"
UNDOING_SAID = (
    "We couldn't complete the change. We're undoing what we started; this page updates by itself."
)
SLOW = "This is taking a little longer than usual"
SLOW_SAID = "One of our partners is slow to answer. We'll keep trying; this page updates by itself."
RECEIVED = "We've received your request"
RECEIVED_SAID = "We'll start on it in a moment. This page updates by itself."
WORKING = "We're working on your request"
WORKING_SAID = "This usually takes less than a minute. This page updates by itself."
ARCHIVED = "This request is closed"
ARCHIVED_SAID = (
    "It was finished a while ago, so its step-by-step progress is no longer kept. The e-mail "
    "we sent you then has the outcome; contact us if you need anything else."
)

# --- what a finished run changed, one line each -------------------------------------------------
NEW_FLIGHT = Sentence("New flight: {flight} on {date}")
NEW_SEAT = Sentence("New seat: {seat}")
FEE_CHARGED = Sentence("Change fee: {fee}, charged to your card")
FEE_WAIVED = "Change fee: none, our team waived it"
FEE_NONE = "Change fee: none for your fare"
CONFIRMATION_SENT = "Confirmation and boarding pass emailed to the address on your booking"
UNTOUCHED = "Nothing was changed: no booking was touched."
NO_EMAIL = "No email was sent about this request."
SEAT_BACK = Sentence(
    "Your seat {seat} on {flight} on {date} was released during the change and has been given "
    "back to you: your booking is as it was."
)
SEAT_RELEASED = Sentence("Your original seat {seat} on {flight} on {date} was released.")
BOOKING_AS_IT_WAS = Sentence("Your booking was not changed: still {flight} on {date}, seat {seat}.")
FEE_REFUNDED = Sentence("The {fee} change fee was refunded to your card.")
FEE_RELEASED = Sentence(
    "The {fee} change fee was only held on your card, and the hold was released: you have not "
    "been charged."
)
DETAILS_EMAILED = "We've emailed the details to the address on your booking."

# --- the fee waiver's outcome -----------------------------------------------------------------
WAIVER_TIMED_OUT = (
    "Fee waiver: our team couldn't review your request in time, so the standard change fee applies."
)


def waiver_reply(reply: str, *, granted: bool) -> str:
    """What the customer is told of our team's decision on their fee waiver: one of the
    policy's sentences for that outcome (the first when the decision chose none), or the words
    the operator typed in the admin's field for the customer, which they saw in a preview
    (agentflow._core.replies) — never their reason, never their name."""
    offered = policy.WAIVER_REPLIES["approve" if granted else "reject"]
    other = policy.WAIVER_REPLIES["reject" if granted else "approve"]
    told = " ".join((reply or "").split())
    if told in offered:
        return told
    if told and told not in other:  # the other outcome's sentence would say the opposite
        return told[: policy.WAIVER_REPLY_MAX_CHARS]
    return offered[0]


# --- why a change could not be made -------------------------------------------------------------
@dataclass(frozen=True)
class Failure:
    """A failure the domain raises (`recognise`: its error, as a regular expression whose
    named groups are facts), and the sentence the customer is told of it."""

    recognise: str
    says: Sentence


def _exactly(sentence: Sentence) -> Failure:
    return Failure(recognise=sentence.recogniser, says=sentence)


SOMETHING_WRONG = "Something went wrong on our side."
TEAM_STOPPED = "Our team stopped this change before it was finished."
ASSISTANT_REFUSED = (
    "We stopped this change: our automated assistant asked for something a refund must never "
    "do, and nothing was done."
)
OVER_LIMITS = (
    "We stopped this change: our automated assistant could not finish it within the steps we "
    "allow, so we undid what it had started."
)
#: A second request for a booking an earlier one already changed (refunds.priorities): the
#: runs of one booking go one at a time, so the second reads what the first did.
ALREADY_CHANGED_TO = Sentence(
    "Your booking was already changed by your earlier request: you're now on {flight} on "
    "{date}, seat {seat}. We didn't change it again."
)
ALREADY_CHANGED = (
    "Your booking was already changed by your earlier request. We didn't change it again."
)
#: Every failure the domain raises for customers to read, as it reads them.
FAILURES: tuple[Failure, ...] = (
    _exactly(Sentence("These details don't match a booking.")),
    _exactly(Sentence("Basic fares can't be changed. Your original booking is unchanged.")),
    Failure(
        recognise=r"We can't change an? .* fare online; please contact us\.",
        says=Sentence("We can't change this fare online; please contact us."),
    ),
    _exactly(Sentence("We can't move you to {date}: that date has already passed.")),
    _exactly(
        Sentence(
            "We can't book {date} yet: the airline sells seats up to {last}. Please ask again "
            "nearer the time, or choose an earlier date."
        )
    ),
    _exactly(
        Sentence(
            "We couldn't find flight {flight} on {date} in the airline's schedule. Please check "
            "the flight number and date and send a new request."
        )
    ),
    _exactly(
        Sentence(
            "Your bank asked for an extra check on this payment, which we can't do by email. "
            "You have not been charged."
        )
    ),
    Failure(
        recognise=r"Your payment did not go through\b.*",
        says=Sentence("Your payment did not go through."),
    ),
    _exactly(Sentence("Your card was declined ({decline}).")),
    _exactly(Sentence("Your card was declined.")),
    _exactly(
        Sentence(
            "Your card's hold for the change fee ended before we finished: you have not been "
            "charged."
        )
    ),
    _exactly(
        Sentence("We couldn't finish changing your booking, so we did not take the change fee.")
    ),
    _exactly(Sentence("We couldn't finish changing your booking: {missing}.")),
    _exactly(ALREADY_CHANGED_TO),
    _exactly(Sentence(ALREADY_CHANGED)),
    Failure(
        recognise=r"We couldn't find your request\b.*",
        says=Sentence("We couldn't find your request."),
    ),
    Failure(
        recognise=r"We couldn't find booking .*", says=Sentence("We couldn't find your booking.")
    ),
    _exactly(Sentence("We can't send email to the address on the booking.")),
    # The agent's guardrails (refunds.agent.guardrails): what the model asked for is said only
    # as facts of their kind (an amount, a booking reference), else not at all.
    _exactly(
        Sentence(
            "We stopped this change: our automated assistant asked to charge {asked}, but the "
            "change fee for booking {reference} is {fee}, so no charge was made."
        )
    ),
    Failure(
        recognise=r"We stopped this change: our automated assistant asked .*",
        says=Sentence(ASSISTANT_REFUSED),
    ),
    Failure(recognise=r"The agent (?:used all|spent) .*", says=Sentence(OVER_LIMITS)),
)
#: Plain explanations by failed step, for errors not written for the customer's eyes
#: (retries exhausted, a partner's refusal, a bug).
STEP_TROUBLE: Mapping[str, str] = {
    "fetch_booking": "We couldn't reach the airline to look up your booking.",
    "check_flight": "We couldn't reach the airline to check your new flight.",
    "cancel_seat": "The airline's system didn't respond when we tried to change your seat.",
    "charge_customer": "We couldn't reach our payment provider to secure the change fee.",
    "issue_boarding_pass": "The airline couldn't issue your new boarding pass.",
    "capture_fee": "We couldn't reach our payment provider to take the change fee.",
}


def failure(step: str | None, error: str) -> str:
    """Why the change could not be made, as the customer is told: the sentence of the failure
    `error` was raised as (its facts taken from it, each of its kind), else the plain sentence
    of the step that failed (`step`; None: the run failed between steps)."""
    for known in FAILURES:
        found = re.fullmatch(known.recognise, (error or "").strip(), flags=re.DOTALL)
        if found is not None:
            said = known.says.say(**{k: v for k, v in found.groupdict().items() if v})
            if said:
                return said
    return STEP_TROUBLE.get(step or "", SOMETHING_WRONG)


def failure_told(text: str) -> str:
    """A failure explanation recorded earlier (the failure e-mail's step keeps what it told),
    shown again only if it is one of these sentences: anything else is the plain one."""
    return text if _matches(_FAILURE_PATTERN, text) else SOMETHING_WRONG


# --- the whole set, and whether a text is made of it alone --------------------------------------
def catalogue() -> Iterator[Sentence]:
    """Every sentence a customer may read here (the e-mails' own lines are in their templates)."""
    texts: list[str | Sentence] = [
        *STEP_LABELS.values(),
        *NO_FEE_LABELS.values(),
        *WAIVED_LABELS.values(),
        GENERIC_LABEL,
        *STATE_LABELS.values(),
        DONE,
        DONE_SAID,
        REFUNDED,
        NOT_CHANGED,
        REFUND_COMING,
        REFUND_COMING_EMAILED,
        FAILED,
        NOT_CHARGED,
        HOLD_GONE,
        TRY_AGAIN,
        EMAILED_TRY_AGAIN,
        LOOKING,
        LOOKING_SAID,
        STOPPED,
        STOPPED_SAID,
        AWAITING,
        AWAITING_WITHIN,
        AWAITING_NOTHING_MOVES,
        UNDOING,
        UNDOING_SAID,
        SLOW,
        SLOW_SAID,
        RECEIVED,
        RECEIVED_SAID,
        WORKING,
        WORKING_SAID,
        ARCHIVED,
        ARCHIVED_SAID,
        NEW_FLIGHT,
        NEW_SEAT,
        FEE_CHARGED,
        FEE_WAIVED,
        FEE_NONE,
        CONFIRMATION_SENT,
        UNTOUCHED,
        NO_EMAIL,
        SEAT_BACK,
        SEAT_RELEASED,
        BOOKING_AS_IT_WAS,
        FEE_REFUNDED,
        FEE_RELEASED,
        DETAILS_EMAILED,
        WAIVER_TIMED_OUT,
        *policy.WAIVER_REPLIES["approve"],
        *policy.WAIVER_REPLIES["reject"],
        *_failure_sentences(),
    ]
    seen: set[str] = set()
    for text in texts:
        sentence = text if isinstance(text, Sentence) else Sentence(text)
        if sentence.text not in seen:
            seen.add(sentence.text)
            yield sentence


def is_customer_text(text: str, *, also: tuple[str, ...] = ()) -> bool:
    """True when `text` is one or more sentences of the catalogue, one after the other (or of
    `also`: words an operator wrote for the customer and previewed)."""
    extra = "|".join(re.escape(t) for t in also if t)
    pattern = f"{_ANY}|{extra}" if extra else _ANY
    return _matches(pattern, text)


def _failure_sentences() -> Iterator[str | Sentence]:
    yield from (known.says for known in FAILURES)
    yield from STEP_TROUBLE.values()
    yield from (SOMETHING_WRONG, TEAM_STOPPED)


def _matches(alternatives: str, text: str) -> bool:
    return re.fullmatch(f"(?:{alternatives})(?: (?:{alternatives}))*", text) is not None


_FAILURE_PATTERN = "|".join(Sentence(str(s)).pattern for s in _failure_sentences())
_ANY = "|".join(sentence.pattern for sentence in catalogue())
