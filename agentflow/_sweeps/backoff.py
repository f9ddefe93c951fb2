"""How long the sweeper leaves a run alone after ringing its doorbell: doubling while no worker
answers, so a backlogged queue is not flooded with duplicates of the messages it still holds.

The broker is a doorbell (docs/how-it-works.md, "Postgres is the truth, the broker is a
doorbell"): a run past its wake-up time is re-published because its message may be lost. But a
message that waits in a queue longer than a lease is not lost, only late, and each duplicate
lengthens the queue it waits in. Ringing at a fixed lease turns a burst into a storm (every
queued run re-published at every lease, the queue longer at each); doubling the gap for as long
as nobody answers bounds the duplicates of one message to 1 + log2(wait / lease), and a
worker's answer (any write to the run: a claim, an advance, a wait) starts the count over, so a
lost message on an idle queue is still rung for one lease after it was published.
"""

from __future__ import annotations


def grace_seconds(*, lease: float, unanswered_seconds: float | None, cap: float) -> float:
    """Seconds to the next ring. `unanswered_seconds`: since the first ring no worker has
    answered (None: this is that first ring). The gaps are 1, 2, 4, 8 … leases (each the time
    unanswered so far plus a lease), so the k-th ring of one message comes 2^(k-1) leases after
    it was published and a message queued W seconds is rung at most 1 + log2(W / lease) times;
    the gap stops growing at `cap`, and is never shorter than one lease."""
    waited = 0.0 if unanswered_seconds is None else max(unanswered_seconds, 0.0)
    return max(lease, min(waited + lease, cap))
