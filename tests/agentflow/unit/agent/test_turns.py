"""Model turns stored as deltas with a chained digest: the same call exactly when the whole
request (model, every message, every tool) is, each message stored once."""

from __future__ import annotations

import json
from typing import Any

from agentflow.agent.conversation import (
    assistant_message,
    system_message,
    tool_result_message,
    user_message,
)
from agentflow.agent.fingerprint import Fingerprint, llm_fingerprint
from agentflow.agent.turns import Turns, whole_request

TOOLS = [{"type": "function", "function": {"name": "count", "parameters": {"type": "object"}}}]


def conversation(turns: int) -> list[list[dict[str, Any]]]:
    """The messages of each of `turns` requests of a loop that appends to one list."""
    messages = [system_message("You count."), user_message("Count.")]
    requests = [list(messages)]
    for turn in range(1, turns):
        messages.append(assistant_message(None))
        messages.append(tool_result_message(f"call_{turn}", {"n": turn}))
        requests.append(list(messages))
    return requests


def observed(requests: list[list[dict[str, Any]]], *, model: str = "m", tools: Any = TOOLS):
    turns = Turns(tools)
    found = []
    for request in requests:
        digest = turns.observe(model, request)
        turn = turns.latest()
        assert turn.digest == digest
        found.append(turn)
    return found


def stored(turn: Any, position: int) -> Fingerprint:
    """As read back from `jsonb`."""
    return Fingerprint.from_json(json.loads(json.dumps(turn.fingerprint(position).as_json())))


def test_turns__each_turn_stores_only_the_messages_it_added() -> None:
    requests = conversation(4)

    turns = observed(requests)

    assert [(t.keep, len(t.added)) for t in turns] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert [t.tools is not None for t in turns] == [True, False, False, False]


def test_turns__the_chained_digest_is_the_digest_of_the_whole_request() -> None:
    requests = conversation(3)

    turns = observed(requests)

    for position, (turn, request) in enumerate(zip(turns, requests, strict=True), start=1):
        whole = llm_fingerprint(position, model="m", messages=request, tools=TOOLS)
        assert stored(turn, position).matches(whole)


def test_turns__the_whole_request_is_rebuilt_from_the_deltas_in_order() -> None:
    requests = conversation(3)
    before = None
    for position, turn in enumerate(observed(requests), start=1):
        before = whole_request(turn.fingerprint(position).arguments, before)
        assert before == {"model": "m", "messages": requests[position - 1], "tools": TOOLS}


def test_turns__a_changed_earlier_message_model_or_tool_changes_the_digest() -> None:
    requests = conversation(3)
    recorded = observed(requests)[-1].digest
    earlier = [list(r) for r in requests]
    earlier[2][1] = user_message("Count backwards.")  # the first user message, in turn 3 only
    other_tools = [{**TOOLS[0], "function": {"name": "count", "description": "Squares."}}]

    assert observed(earlier)[-1].digest != recorded
    assert observed(requests, model="m2")[-1].digest != recorded
    assert observed(requests, tools=other_tools)[-1].digest != recorded
    assert observed(requests)[-1].digest == recorded


def test_turns__a_message_changed_in_place_after_it_was_sent_is_found() -> None:
    messages = [system_message("You count."), user_message("Count.")]
    turns = Turns(TOOLS)
    turns.observe("m", messages)
    messages.append(assistant_message(None))
    turns.observe("m", messages)
    assert not turns.changed_in_place()

    messages[1]["content"] = "Count backwards."  # the same object, kept by identity

    assert turns.changed_in_place()


def test_turns__exact_compares_by_value_what_identity_kept() -> None:
    """What a replay run again `exact` computes for a function that edits sent messages."""
    messages = [system_message("You count."), user_message("Count.")]
    exact = Turns(TOOLS, exact=True)
    exact.observe("m", messages)
    messages[1]["content"] = "Count backwards."
    messages.append(assistant_message(None))

    exact.observe("m", messages)
    turn = exact.latest()

    assert turn.keep == 1 and len(turn.added) == 2
    whole = llm_fingerprint(2, model="m", messages=messages, tools=TOOLS)
    assert stored(turn, 2).matches(whole)


def test_turns__a_turn_recorded_whole_before_deltas_reads_as_keeping_nothing() -> None:
    request = conversation(2)[-1]
    old = {"model": "m", "messages": request, "tools": TOOLS}
    data = {"position": 3, "kind": "llm", "name": "llm", "arguments": old, "digest": "old-form"}

    read = Fingerprint.from_json(data)

    assert read.matches(llm_fingerprint(3, model="m", messages=request, tools=TOOLS))
    assert whole_request(old, None) == old
