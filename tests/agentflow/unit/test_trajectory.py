"""An agent run's conversation from its rows: compact values, branches after two forks, and
tokens saved by replay counted in the branch each task saw."""

from __future__ import annotations

from typing import Any

import pytest

from agentflow.admin import display, trajectory
from agentflow.admin.recorded_calls import Part
from agentflow.models import RunEvent, StepCheckpoint, SupersededStep, WorkflowRun
from tests.support.timelines import at

RUN = "wf_unit"


def turn(seq: int, tokens: int, **fields: Any) -> dict[str, Any]:
    return {
        "seq": seq,
        "name": "llm",
        "kind": "llm",
        "arguments": {
            "position": seq,
            "kind": "llm",
            "name": "llm",
            "arguments": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        },
        "output": {
            "message": {"role": "assistant", "content": f"turn at {seq}"},
            "finish_reason": "stop",
            "usage": {"prompt_tokens": tokens - 1, "completion_tokens": 1, "total_tokens": tokens},
            "model": "m",
        },
        **fields,
    }


def tool(seq: int, **fields: Any) -> dict[str, Any]:
    return {
        "seq": seq,
        "name": "lookup",
        "kind": "read",
        "arguments": {"position": seq, "kind": "tool", "name": "lookup", "arguments": {"n": seq}},
        "output": {"ok": True, "result": {"n": seq}},
        **fields,
    }


def checkpoint(row: dict[str, Any]) -> StepCheckpoint:
    return StepCheckpoint(
        run_id=RUN,
        status="COMPLETED",
        attempts=1,
        idempotency_key=f"k{row['seq']}",
        started_at=at(row["seq"]),
        finished_at=at(row["seq"]),
        **row,
    )


def set_aside(branch: int, row: dict[str, Any], *, when: float) -> SupersededStep:
    return SupersededStep(
        run_id=RUN,
        branch=branch,
        status="COMPLETED",
        attempts=1,
        idempotency_key=f"b{branch}-k{row['seq']}",
        started_at=at(row["seq"]),
        finished_at=at(row["seq"]),
        superseded_at=at(when),
        **row,
    )


def fork(position: int, branch: int, *, when: float) -> RunEvent:
    return RunEvent(
        run_id=RUN,
        kind=RunEvent.Kind.FORK,
        at=at(when),
        actor="ops",
        seq=position,
        detail=f"fork {branch}",
        data={"position": position, "branch": branch},
    )


def test_compact__short_values_on_one_line_long_ones_cut_with_their_size() -> None:
    assert display.compact({"item": "apple", "qty": 2}) == display.Shown(
        '{"item": "apple", "qty": 2}', multiline=False
    )
    long = display.compact({"note": "é" * 1000, "list": list(range(100))})
    assert long.multiline
    assert f'"{"é" * display.MAX_STRING_CHARS}… (2.0 kB in all)"' in long.text
    assert '"… 70 more items"' in long.text
    deep: Any = "bottom"
    for _ in range(20):
        deep = {"d": deep}
    assert "{… 1 key}" in display.compact(deep).text
    assert display.compact(None).text == "null"


@pytest.mark.parametrize("told", [True, False], ids=["fork events read", "fork events too old"])
def test_two_forks__each_branch_sees_its_own_history__savings_counted_where_tasks_ran(
    told: bool,
) -> None:
    """Branch 0 made 1-6; a fork from 4 made branch 1 (4, 5); a fork from 2 made branch 2,
    the current one (2, 3, 4). Rows set aside by the second fork include 2 and 3 of branch 0.
    Fork events older than the events a page reads are told by the rows they set aside."""
    run = WorkflowRun(id=RUN, workflow="w", version=1, status="NEEDS_ATTENTION", branch=2)
    steps = [checkpoint(turn(1, 10)), checkpoint(tool(2)), checkpoint(tool(3))]
    steps.append(checkpoint(turn(4, 300)))
    superseded = [
        set_aside(0, turn(4, 100), when=10),
        set_aside(0, tool(5), when=10),
        set_aside(0, tool(6), when=10),
        set_aside(1, tool(2), when=20),
        set_aside(1, tool(3), when=20),
        set_aside(1, turn(4, 200), when=20),
        set_aside(1, tool(5), when=20),
    ]
    events = [fork(4, 1, when=10), fork(2, 2, when=20)] if told else []

    found = trajectory.build(run, steps, superseded, events)

    assert [c.position for c in found.calls] == [1, 2, 3, 4]
    assert [(b.number, b.positions) for b in found.branches] == [
        (1, "positions 2-5"),
        (0, "positions 4-6"),
    ]
    forks = [(b.fork.at, b.fork.position, b.fork.reason) for b in found.branches if b.fork]
    reasons = ["fork 2", "fork 1"] if told else ["", ""]
    assert forks == [(at(20), 2, reasons[0]), (at(10), 4, reasons[1])]
    # Turn 1 was handed back by every later task of every branch: 2, 3 of branch 0 (kept by
    # the first fork, set aside by the second), 4-6 of branch 0, 4-5 of branch 1, 2-4 now.
    first = found.calls[0]
    assert (first.replayed, first.saved) == (10, 100)
    old_turns = {b.number: next(c for c in b.calls if c.part == Part.TURN) for b in found.branches}
    assert (old_turns[0].saved, old_turns[1].saved) == (200, 200)  # by 5, 6 / by 5
    assert found.calls[3].saved == 0  # nothing ran after it (the run is not finished)
    assert found.saved == 500
    assert (found.spent, found.spent_superseded) == (310, 300)
    assert [c.turn for c in found.turns] == [1, 2]
