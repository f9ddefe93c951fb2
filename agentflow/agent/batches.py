"""Parallel read-only tool calls: which calls of a model turn run at once, and how a run says
that it is running them.

A turn that asks for several tools in a row that only read (declared `read_only`, needing no
approval; or refused, which run nothing) runs them as one batch: each a step task of its own,
all published together, at the consecutive positions the function would have made them at,
joined when every one is recorded (`store.batches`). Their results enter the conversation in
the model's order, since the function reads them back in that order on the next replay. A side
effect ends a batch: effects stay one at a time, in the model's order.

While a batch runs, the run's `current_step` names it (`(calls 5-6 at once)`) and its
`current_seq` stays at the batch's first position; every write of a member is fenced on both.
A member sees the run's history before the batch, not its siblings' results: they run at once.
"""

from __future__ import annotations

import re

_SPAN = re.compile(r"\(calls (\d+)-(\d+) at once\)")


def batch_step(first: int, last: int) -> str:
    """The run's `current_step` while positions `first`..`last` run at once."""
    return f"(calls {first}-{last} at once)"


def batch_span(current_step: str) -> tuple[int, int] | None:
    """(first, last) if `current_step` names a batch, else None."""
    found = _SPAN.fullmatch(current_step or "")
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2))
