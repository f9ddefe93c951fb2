"""What a model turn cost in dollars, from its model and usage, through a maintained price table.

Prices come from `genai-prices` (Pydantic's table, the one Pydantic AI's spans carry): no
price is written here. A model the table does not know costs "unknown" (None), never zero: a
self-hosted model behind an OpenAI-compatible server has no list price, and a budget or a
dashboard that read it as free would be wrong. A turn's cost is recorded with the turn, at
the price of the day it was asked, so a replay, the run page and a budget all read the same
figure however the table changes later.
"""

from __future__ import annotations

import importlib.util
from decimal import Decimal
from functools import lru_cache
from typing import Any

from agentflow.agent.conversation import ModelResponse

#: Where a recorded turn keeps its cost: a decimal string of US dollars, or null (unknown).
COST_KEY = "cost_usd"


def available() -> bool:
    """The price table is the `agent` extra: without it every cost is unknown."""
    return importlib.util.find_spec("genai_prices") is not None


def cost_usd(
    *, model: str, input_tokens: int, output_tokens: int, provider: str = ""
) -> Decimal | None:
    """The price of one request to `model` with these tokens, or None when the table does not
    know the model (for `provider`, when given: "openai" prices only OpenAI's own models)."""
    if not model or not available():
        return None
    return _cost(model, provider, max(0, input_tokens), max(0, output_tokens))


@lru_cache(maxsize=4096)
def _cost(model: str, provider: str, input_tokens: int, output_tokens: int) -> Decimal | None:
    import genai_prices

    usage = genai_prices.Usage(input_tokens=input_tokens, output_tokens=output_tokens)
    options: dict[str, Any] = {"provider_id": provider} if provider else {}
    try:
        found = genai_prices.calc_price(usage, model, **options)
    except LookupError:
        return None
    return Decimal(found.total_price)


def turn_cost(response: ModelResponse) -> Decimal | None:
    """A turn's cost from what answered it and the usage it reported."""
    return cost_usd(
        model=response.model,
        input_tokens=response.usage.prompt_tokens,
        output_tokens=response.usage.completion_tokens,
        provider=response.provider,
    )


def recorded(output: Any) -> Decimal | None:
    """The cost a recorded turn keeps (None: unknown, or recorded before costs were)."""
    value = output.get(COST_KEY) if isinstance(output, dict) else None
    if not isinstance(value, str):
        return None
    try:
        found = Decimal(value)
    except ArithmeticError:
        return None
    return found if found.is_finite() and found >= 0 else None


def as_text(cost: Decimal | None) -> str | None:
    """How a cost is recorded: plain decimal text (JSON has no decimals), None unknown."""
    return None if cost is None else format(cost.normalize(), "f")
