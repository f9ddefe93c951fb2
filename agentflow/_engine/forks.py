"""An operator's fork of an agent run (docs/protocol.md, "Operator actions"): every effect the fork
would set aside whose outcome is unknown is first asked of its partner, outside any transaction; the
store's fenced fork then sets it aside as found (adopted) or absent, and refuses if the partner
could not tell or anything moved meanwhile. A new branch so never repeats an effect that happened.
"""

from __future__ import annotations

import logging
from functools import partial

from agentflow import _store as store
from agentflow._base import outcomes
from agentflow._core import registry
from agentflow._core.registry import CodeDefined
from agentflow._privacy import scope as privacy
from agentflow.models import WorkflowRun

logger = logging.getLogger("agentflow.forks")  # the name hosts' LOGGING knows


def fork(run_id: str, *, position: int, actor: str, reason: str) -> None:
    """Fork `run_id` from `position` (see `store.run_fork`), asking partners first."""
    settled = _ask_partners(run_id, position)
    with privacy.run_scope(run_id, personal=True):  # the copies it keeps stay sealed
        store.run_fork(run_id, position=position, actor=actor, reason=reason, settled=settled)


def _ask_partners(run_id: str, position: int) -> dict[int, store.Settled]:
    run = WorkflowRun.objects.filter(pk=run_id).first()
    workflow = registry.lookup(run.workflow, run.version) if run is not None else None
    if run is None or not isinstance(workflow, CodeDefined):
        return {}  # the store refuses with the reason
    live = {seq for seq, _ in store.live_calls(run_id)}
    answers = {}
    for cp in store.fork_preview(run_id, position):
        if cp.seq in live or not outcomes.unsettled(
            kind=cp.kind, status=cp.status, retryable=cp.retryable
        ):
            continue
        try:
            found = workflow.ask_partner(
                run_id=run_id,
                input=run.input,
                call=cp,
                earlier=partial(store.calls_load, run_id, cp.seq),
            )
        except Exception as exc:
            logger.info("%s: fork could not learn whether %s happened: %s", run_id, cp.name, exc)
            why = str(exc) or type(exc).__name__
            answers[cp.seq] = store.Settled(fence=cp.fence, happened=None, why=why)
            continue
        answers[cp.seq] = store.Settled(fence=cp.fence, happened=found is not None, output=found)
    return answers
