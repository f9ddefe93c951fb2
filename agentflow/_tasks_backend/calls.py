"""What a task's run records: the enqueue's arguments and earliest start (its input), and the
name of its one step."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

#: A task's workflow version: a task has one definition, its function.
VERSION = 1
#: The name of the one step a task's run makes (its checkpoint, its crash points).
STEP = "task"


@dataclass(frozen=True, kw_only=True)
class Call:
    """What an enqueue recorded as the run's input: the arguments, and the earliest start."""

    args: list[Any]
    kwargs: dict[str, Any]
    run_after: datetime | None = None

    def as_input(self) -> dict[str, Any]:
        after = self.run_after.isoformat() if self.run_after is not None else None
        return {"args": self.args, "kwargs": self.kwargs, "run_after": after}

    @classmethod
    def from_input(cls, data: Any) -> Call:
        after = data.get("run_after")
        return cls(
            args=list(data.get("args") or []),
            kwargs=dict(data.get("kwargs") or {}),
            run_after=datetime.fromisoformat(after) if after else None,
        )

    @property
    def first_position(self) -> int:
        """The position of the task's own first call (after the `run_after` wait, if any)."""
        return 2 if self.run_after is not None else 1
