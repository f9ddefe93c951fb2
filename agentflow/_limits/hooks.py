"""What partner limits add to the core's rounds (docs/layout.md, "Features beside the core"):
every sweeper pass hands places at a partner freed by a lease that ran out or an owner that died
to its oldest waiters (docs/partner-limits.md, "What happens"), since nobody else may call that
partner to hand them on. `install()` registers it, from `AgentflowConfig.ready()`, before the
schedules' part.
"""

from __future__ import annotations

from agentflow._core import features
from agentflow._limits import rules
from agentflow._limits.store import partners_tick


def install() -> None:
    features.on_sweep(
        "partner limits", _partner_places, failed="the partner places could not be handed on"
    )


def _partner_places() -> None:
    configured = rules.configured()
    if configured:
        partners_tick(configured)
