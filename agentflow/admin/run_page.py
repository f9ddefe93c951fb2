"""What a run's page draws from its rows: the timeline (every run) and the conversation (code-
first runs), each read from the same rows, loaded once. Either that cannot be drawn is logged and
left out: the tables below it still tell all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from django.utils import timezone

from agentflow._base.states import RunStatus, StepStatus
from agentflow._core import registry
from agentflow.admin import forking, timeline, timeline_svg, trajectory
from agentflow.admin.privacy import Privacy
from agentflow.agent.loop import CodeWorkflow
from agentflow.models import RunEvent, RunWait, StepCheckpoint, SupersededStep, WorkflowRun

logger = logging.getLogger(__name__)

#: The timeline draws at most this many of a run's events, the latest (a run swept every few
#: seconds for days has thousands, and its recent history is what an operator needs).
TIMELINE_EVENTS = 1000


@dataclass(frozen=True, kw_only=True)
class RunRows:
    """What the run page draws from, read once for the timeline and the conversation."""

    steps: list[StepCheckpoint]
    #: The newest TIMELINE_EVENTS events, oldest first.
    events: list[RunEvent]
    events_cut: bool
    superseded: list[SupersededStep]
    #: Its timers, signals and approvals, every branch's.
    waits: list[RunWait]

    def shown(self, privacy: Privacy) -> RunRows:
        """The rows as this viewer may read them (agentflow.admin.privacy): everything drawn
        from them, the timeline's hovers and the conversation too, masks what they may not."""
        if not privacy.redacts:
            return self
        return replace(
            self,
            steps=privacy.rows(self.steps),
            events=privacy.rows(self.events),
            superseded=privacy.rows(self.superseded),
            waits=privacy.rows(self.waits),
        )

    @classmethod
    def load(cls, run: WorkflowRun) -> RunRows:
        """Three queries, four for a forked run."""
        newest = list(RunEvent.objects.filter(run=run).order_by("-at", "-id")[:TIMELINE_EVENTS])
        return cls(
            steps=list(StepCheckpoint.objects.filter(run=run).order_by("seq")),
            events=newest[::-1],
            events_cut=len(newest) >= TIMELINE_EVENTS,
            superseded=(
                list(SupersededStep.objects.filter(run=run).order_by("branch", "seq"))
                if run.branch
                else []
            ),
            waits=list(RunWait.objects.filter(run=run).order_by("branch", "seq")),
        )


def timeline_of(run: WorkflowRun, rows: RunRows) -> dict[str, Any] | None:
    """The run's timeline as inline SVG with a one-line caption, or None, logged, if it cannot
    be drawn: the picture is a convenience, the tables below still tell all."""
    try:
        drawn = timeline.build(
            run,
            rows.steps,
            rows.events,
            now=timezone.now(),
            events_cut=rows.events_cut,
            superseded=rows.superseded,
            waits=rows.waits,
        )
        return {"svg": timeline_svg.render(drawn), "caption": timeline_svg.describe(drawn)}
    except Exception:
        logger.exception("the timeline of run %s could not be drawn", run.pk)
        return None


def trajectory_of(run: WorkflowRun, rows: RunRows, *, may_fork: bool) -> dict[str, Any] | None:
    """An agent run's conversation (None for a graph run), with the fork links an operator
    may follow; {"failed": True}, logged, if it cannot be read."""
    code_first = isinstance(registry.lookup(run.workflow, run.version), CodeWorkflow)
    if not code_first and not trajectory.looks_code_first(run, rows.steps):
        return None
    try:
        found = trajectory.build(
            run, rows.steps, rows.superseded, rows.events, events_cut=rows.events_cut
        )
    except Exception:
        logger.exception("the conversation of run %s could not be read", run.pk)
        return {"failed": True}
    return {
        "t": found,
        "default_position": _fork_position(found),
        "fork_url": forking.fork_url(run.pk) if may_fork and forking.offered(run) else "",
        "completed": run.status == RunStatus.COMPLETED,
    }


def _fork_position(found: trajectory.Trajectory) -> int:
    """Where the Fork button starts: the open divergence, else the first call that did not
    complete, else after the last call (the confirmation page can pick another)."""
    diverged = found.open_divergence
    if diverged is not None and diverged.position:
        return diverged.position
    unfinished = [c.position for c in found.calls if c.status != StepStatus.COMPLETED]
    return min(unfinished, default=found.next_position)
