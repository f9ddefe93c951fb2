"""Divergence diffs on realistic cases: what an operator reads before deciding to fork."""

from __future__ import annotations

import json

from agentflow.agent.conversation import (
    system_message,
    tool_result_message,
    user_message,
)
from agentflow.agent.divergence import MAX_CHANGES, diff_values, diverges
from agentflow.agent.fingerprint import (
    Fingerprint,
    llm_fingerprint,
    step_fingerprint,
    tool_fingerprint,
)

SYSTEM = (
    "You handle flight change requests for Skyways. Look the request up, check the booking and "
    "its cancellation policy, cancel the seat, charge exactly the policy's fee, issue the new "
    "boarding pass, note it in the CRM and e-mail the customer. Never charge twice."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "charge_customer",
            "description": "Charge the change fee.",
            "parameters": {
                "type": "object",
                "properties": {
                    "refund_id": {"type": "string"},
                    "amount_cents": {"type": "integer"},
                },
                "required": ["refund_id", "amount_cents"],
            },
        },
    }
]


def conversation(seat: str = "12C") -> list[dict]:
    return [
        system_message(SYSTEM),
        user_message("Refund request: rf_1\nPlease move me to SK1240 on 2027-03-16."),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1_1",
                    "type": "function",
                    "function": {
                        "name": "fetch_booking",
                        "arguments": '{"booking_reference":"ABC123"}',
                    },
                }
            ],
        },
        tool_result_message(
            "call_1_1", {"reference": "ABC123", "seat": seat, "fare_class": "standard"}
        ),
    ]


def test_same_call__no_divergence() -> None:
    recorded = tool_fingerprint(7, "charge_customer", {"refund_id": "rf_1", "amount_cents": 4500})
    now = tool_fingerprint(7, "charge_customer", {"amount_cents": 4500.0, "refund_id": "rf_1"})
    assert diverges(recorded, now) is None


def test_tool_arguments_changed__names_the_argument() -> None:
    recorded = tool_fingerprint(7, "charge_customer", {"refund_id": "rf_1", "amount_cents": 4500})
    now = tool_fingerprint(7, "charge_customer", {"refund_id": "rf_1", "amount_cents": 1})

    found = diverges(recorded, now)

    assert found is not None
    assert found.text() == (
        "Position 7 diverged: the tool call charge_customer changed.\n"
        "  arguments.amount_cents: 4500 → 1"
    )


def test_same_tool_name_other_arguments__is_a_divergence_not_a_memo_hit() -> None:
    """The seed's memo keyed by tool name would replay the first booking for the second."""
    recorded = tool_fingerprint(4, "fetch_booking", {"booking_reference": "ABC123"})
    now = tool_fingerprint(4, "fetch_booking", {"booking_reference": "XYZ789"})

    found = diverges(recorded, now)

    assert found is not None
    assert [c.as_json() for c in found.changes] == [
        {"path": "arguments.booking_reference", "recorded": '"ABC123"', "now": '"XYZ789"'}
    ]


def test_other_tool_at_the_position__headline_says_both() -> None:
    recorded = tool_fingerprint(8, "cancel_seat", {"booking_reference": "ABC123"})
    now = tool_fingerprint(8, "charge_customer", {"refund_id": "rf_1", "amount_cents": 4500})

    text = diverges(recorded, now).text()  # type: ignore[union-attr]

    assert text.splitlines()[0] == (
        "Position 8 diverged: recorded tool call cancel_seat, now tool call charge_customer."
    )
    assert "  call: tool call cancel_seat → tool call charge_customer" in text
    assert '  arguments.booking_reference: "ABC123" → —' in text
    assert "  arguments.amount_cents: — → 4500" in text


def test_model_turn_where_a_tool_was_recorded__kind_changes() -> None:
    recorded = tool_fingerprint(5, "issue_boarding_pass", {"booking_reference": "ABC123"})
    now = llm_fingerprint(5, model="scripted-refunds", messages=conversation(), tools=TOOLS)

    found = diverges(recorded, now)

    assert found is not None
    assert found.summary == (
        "Position 5 diverged: recorded tool call issue_boarding_pass, "
        "now model turn (scripted-refunds)."
    )


def test_llm_last_message_changed__path_goes_into_the_tool_result() -> None:
    """A tool result is JSON text inside a message: the diff names the field within it."""
    recorded = llm_fingerprint(3, model="gpt-4o-mini", messages=conversation("12C"), tools=TOOLS)
    now = llm_fingerprint(3, model="gpt-4o-mini", messages=conversation("14B"), tools=TOOLS)

    found = diverges(recorded, now)

    assert found is not None
    assert found.text() == (
        "Position 3 diverged: the model turn (gpt-4o-mini) changed.\n"
        '  arguments.messages[3].content.seat: "12C" → "14B"'
    )


def test_llm_message_added__reads_as_one_insertion() -> None:
    longer = conversation()
    longer.insert(2, user_message("Actually, make it the 17th."))
    recorded = llm_fingerprint(3, model="m", messages=conversation(), tools=TOOLS)
    now = llm_fingerprint(3, model="m", messages=longer, tools=TOOLS)

    found = diverges(recorded, now)

    assert found is not None
    assert [c.as_json() for c in found.changes] == [
        {
            "path": "arguments.messages[2]",
            "recorded": "—",
            "now": '{"content": "Actually, make it the 17th.", "role": "user"}',
        }
    ]


def test_llm_system_prompt_edited__shows_the_words_around_the_change() -> None:
    edited = conversation()
    edited[0] = system_message(
        SYSTEM.replace("Never charge twice.", "Never charge more than once.")
    )
    recorded = llm_fingerprint(1, model="m", messages=conversation(), tools=TOOLS)
    now = llm_fingerprint(1, model="m", messages=edited, tools=TOOLS)

    [change] = diverges(recorded, now).changes  # type: ignore[union-attr]

    start = SYSTEM.index("Never charge twice.") + len("Never charge ")
    assert change.path == f"arguments.messages[0].content (from character {start})"
    assert change.recorded.startswith('…"') and change.recorded.endswith('twice."')
    assert change.now.endswith('more than once."')
    assert "e-mail the customer. Never charge " in change.recorded  # the context before


def test_llm_model_and_tool_description_changed__both_listed() -> None:
    tools = json.loads(json.dumps(TOOLS))
    tools[0]["function"]["description"] = "Charge the fee the policy gives."
    recorded = llm_fingerprint(3, model="gpt-4o-mini", messages=conversation(), tools=TOOLS)
    now = llm_fingerprint(3, model="gpt-4.1", messages=conversation(), tools=tools)

    found = diverges(recorded, now)

    assert found is not None
    assert [c.path for c in found.changes] == [
        "arguments.model",
        "arguments.tools[0].function.description",
    ]


def test_tool_call_arguments_in_an_assistant_message__diffed_as_json() -> None:
    other = conversation()
    other[2]["tool_calls"][0]["function"]["arguments"] = '{"booking_reference": "XYZ789"}'
    recorded = llm_fingerprint(3, model="m", messages=conversation(), tools=TOOLS)
    now = llm_fingerprint(3, model="m", messages=other, tools=TOOLS)

    [change] = diverges(recorded, now).changes  # type: ignore[union-attr]

    assert change.path == "arguments.messages[2].tool_calls[0].function.arguments.booking_reference"


def test_json_text_written_differently__shows_the_text() -> None:
    [change] = diff_values('{"a":1}', '{"a": 1}', root="content")
    assert (change.recorded, change.now) == ('"{\\"a\\":1}"', '"{\\"a\\": 1}"')


def test_many_changes__listed_up_to_the_limit_then_counted() -> None:
    recorded = step_fingerprint(2, "load", {f"k{i:02}": i for i in range(30)})
    now = step_fingerprint(2, "load", {f"k{i:02}": i + 1 for i in range(30)})

    found = diverges(recorded, now)

    assert found is not None
    assert len(found.changes) == MAX_CHANGES
    assert found.more == 30 - MAX_CHANGES
    assert found.text().endswith("… and 10 more changes")


def test_keys_that_are_not_identifiers__quoted_in_the_path() -> None:
    [change] = diff_values({"seat map": {"12C": 1}}, {"seat map": {"12C": 2}})
    assert change.path == '["seat map"]["12C"]'


def test_long_values__cut_on_one_line_each() -> None:
    recorded = step_fingerprint(1, "s", {"rows": [list(range(100))]})
    now = step_fingerprint(1, "s", {"rows": [list(range(100)), [1]]})

    found = diverges(recorded, now)

    assert found is not None
    [change] = found.changes
    assert change.path == "arguments.rows[1]" and change.now == "[1]"


def test_divergence_as_json__carries_the_text_for_storage() -> None:
    recorded = tool_fingerprint(9, "update_crm", {"note": "a"})
    stored = Fingerprint.from_json(json.loads(json.dumps(recorded.as_json())))
    now = tool_fingerprint(9, "update_crm", {"note": "b"})

    found = diverges(stored, now)

    assert found is not None
    data = found.as_json()
    assert data["position"] == 9 and data["text"] == found.text()
    assert json.loads(json.dumps(data)) == data
