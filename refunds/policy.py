"""The cancellation policy: by fare class, whether a booking may be changed and for what fee, and
for which reasons a customer may ask to have the fee waived."""

from __future__ import annotations

from dataclasses import dataclass

CURRENCY = "usd"


@dataclass(frozen=True, kw_only=True)
class FarePolicy:
    fare_class: str
    rebookable: bool
    fee_cents: int
    #: Shown to the customer when the change is refused.
    refusal: str = ""


#: The rebooking fee is $45 for standard fares (docs/refunds.md); flex fares change for free.
POLICIES: dict[str, FarePolicy] = {
    "flex": FarePolicy(fare_class="flex", rebookable=True, fee_cents=0),
    "standard": FarePolicy(fare_class="standard", rebookable=True, fee_cents=4500),
    "basic": FarePolicy(
        fare_class="basic",
        rebookable=False,
        fee_cents=0,
        refusal="Basic fares can't be changed. Your original booking is unchanged.",
    ),
}


def policy_for(fare_class: str) -> FarePolicy:
    """The policy of `fare_class`; an unknown class is refused rather than charged a guess."""
    key = (fare_class or "").strip().lower()
    found = POLICIES.get(key)
    if found is not None:
        return found
    return FarePolicy(
        fare_class=key,
        rebookable=False,
        fee_cents=0,
        refusal=f"We can't change a {fare_class or 'unknown'} fare online; please contact us.",
    )


def calculate_penalty_fee(fare_class: str) -> dict[str, int | str]:
    """The fee to charge, as the step output the charge reads: amount in cents and currency."""
    return {"amount_cents": policy_for(fare_class).fee_cents, "currency": CURRENCY}


def format_amount(amount_cents: int, currency: str = CURRENCY) -> str:
    """ "$45.00" for emails and notes."""
    symbol = "$" if currency.lower() == "usd" else f"{currency.upper()} "
    return f"{symbol}{amount_cents / 100:,.2f}"


#: Reasons for which an operator may consider waiving the change fee, as an airline's
#: compassionate policy lists them: (code kept in the request, words the customer and the
#: operator read). Only these are offered on the form; any other case is a normal change.
WAIVER_REASONS: dict[str, str] = {
    "medical": "A medical emergency (yours, or a travelling companion's)",
    "bereavement": "A death in the family",
    "jury_duty": "A court summons or jury duty",
    "military": "Military deployment orders",
}
#: How much the customer may tell us about it: enough for an operator to decide.
WAIVER_DETAILS_MAX_CHARS = 1000
#: What our team may tell the customer of their decision on a waiver, by outcome, the first
#: the default: the admin offers these in the field for the customer, apart from the operator's
#: internal reason, and so may words the operator writes there and sees in a preview. Nothing
#: else an operator types reaches the customer.
WAIVER_REPLIES: dict[str, tuple[str, ...]] = {
    "approve": (
        "Fee waiver: approved by our team, so there is no change fee.",
        "Fee waiver: approved by our team. We're sorry for what happened; there is no change fee.",
    ),
    "reject": (
        "Fee waiver: our team couldn't waive the fee, so the standard change fee applies.",
        "Fee waiver: our team couldn't waive the fee, as the reason given is not one our policy "
        "covers, so the standard change fee applies.",
        "Fee waiver: our team couldn't waive the fee without a document that supports your "
        "request, so the standard change fee applies. If you have one, reply to our e-mail with "
        "it and we'll look again.",
    ),
}
#: The longest reply an operator may write for the customer (the engine's limit too).
WAIVER_REPLY_MAX_CHARS = 500


@dataclass(frozen=True, kw_only=True)
class WaiverProposal:
    """A waiver the policy proposes for an operator's approval: the customer asked, for a
    reason the policy allows to consider, and there is a fee to waive."""

    reason: str
    fee_cents: int

    @property
    def reason_words(self) -> str:
        return waiver_reason_words(self.reason)


def waiver_reason_words(reason: str) -> str:
    """The words of an allowed reason; an unknown code is shown as itself, never dropped."""
    return WAIVER_REASONS.get(reason, reason)


def propose_waiver(*, reason: str, fare_class: str) -> WaiverProposal | None:
    """The waiver to put before an operator, or None: no reason given, one the policy does not
    consider, a fare that cannot change, or no fee to waive (flex fares change for free)."""
    rules = policy_for(fare_class)
    if reason not in WAIVER_REASONS or not rules.rebookable or rules.fee_cents <= 0:
        return None
    return WaiverProposal(reason=reason, fee_cents=rules.fee_cents)
