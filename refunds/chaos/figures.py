"""What an exploration of the money machine did, counted for its JSON report."""

from __future__ import annotations

from collections import Counter
from typing import Any


class Figures:
    """What an exploration did, for the JSON report."""

    def __init__(self) -> None:
        self.examples = 0
        self.rules: Counter[str] = Counter()
        self.checks = 0
        self.refused: Counter[str] = Counter()
        self.engine_errors: Counter[str] = Counter()
        self.ends: Counter[str] = Counter()

    def as_json(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "rules_applied": sum(self.rules.values()),
            "rules": dict(sorted(self.rules.items())),
            "invariant_checks": self.checks,
            "operator_actions_refused": dict(sorted(self.refused.items())),
            "engine_errors": dict(self.engine_errors.most_common()),
            "runs_ended": dict(sorted(self.ends.items())),
        }
