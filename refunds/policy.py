"""The cancellation policy: by fare class, whether a booking may be changed and for what fee."""

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


#: The rebooking fee is SPEC §5's $45 for standard fares; flex fares change for free.
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
