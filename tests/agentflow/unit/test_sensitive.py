"""Declaring what only some may read and what a decision tells the customer (issue 30): the
declarations a step or tool takes, the masking by value, and the Approve / Reject form that keeps
the internal reason apart from the customer's words."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentflow import durable
from agentflow._core.registry import unregister
from agentflow._core.replies import Replies
from agentflow._core.sensitive import Redactor, Sensitive, redacted
from agentflow.admin.forms import OWN_WORDS, DecisionForm
from agentflow.agent import Toolbox, ToolContext
from agentflow.exceptions import DefinitionError

REPLIES = Replies(approve=["Approved."], reject=["Sorry, no.", "Sorry, not without papers."])


# --- declarations ---------------------------------------------------------------------------------
def test_sensitive__names_arguments_and_readers_and_reads_their_values() -> None:
    declared = Sensitive("details", "files", readers=["refunds.view_refundrequest"])

    values = list(declared.values({"details": "a broken leg", "files": ["x.pdf"], "fee": 45}))

    assert declared.arguments == ("details", "files")
    assert declared.readers == ("refunds.view_refundrequest",)
    assert values == ["a broken leg", "x.pdf"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: Sensitive(),
        lambda: Sensitive(""),
        lambda: Sensitive("details", readers="refunds.view_refundrequest"),
        lambda: Sensitive("details", readers=["view_refundrequest"]),
    ],
)
def test_sensitive__a_malformed_declaration_is_refused(make: Any) -> None:
    with pytest.raises(DefinitionError):
        make()


@pytest.mark.parametrize(
    "make",
    [
        lambda: Replies(approve=[], reject=["no"]),
        lambda: Replies(approve="yes", reject=["no"]),
        lambda: Replies(approve=["yes"], reject=[" "]),
    ],
)
def test_replies__a_malformed_declaration_is_refused(make: Any) -> None:
    with pytest.raises(DefinitionError):
        make()


def test_step__declares_sensitive_approval_arguments_and_replies_only_when_it_waits() -> None:
    flow = durable.Workflow("unit_sensitive_step", version=1)
    try:
        flow.step("consider", requires_approval=True, sensitive=Sensitive("note"), replies=REPLIES)(
            lambda ctx: {}
        )
        with pytest.raises(DefinitionError, match="requires_approval"):
            flow.step("other", sensitive=Sensitive("note"))(lambda ctx: {})

        assert flow.sensitive_calls() == {"consider": Sensitive("note")}
        assert flow.replies_of("consider") is REPLIES and flow.replies_of("nope") is None
    finally:
        unregister(flow)


def test_tool__declares_sensitive_parameters_it_takes_and_replies_for_its_approval() -> None:
    box = Toolbox("unit_sensitive_tools")

    @box.tool(
        "file",
        side_effect=True,
        description="File.",
        requires_approval=True,
        sensitive=Sensitive("note", readers=["auth.view_user"]),
        replies=REPLIES,
    )
    def file(ctx: ToolContext, claim: str, note: str) -> dict:
        return {}

    with pytest.raises(DefinitionError, match="does not take"):
        box.tool("other", read_only=True, description="x", sensitive=Sensitive("nope"))(file)
    box.tool(  # a sensitive approval argument, shown to the operator beside the call
        "fourth",
        read_only=True,
        description="x",
        requires_approval=True,
        approval_arguments=lambda ctx, arguments: {"story": ""},
        sensitive=Sensitive("story"),
    )(file)
    with pytest.raises(DefinitionError, match="requires_approval"):
        box.tool("fifth", read_only=True, description="x", approval_arguments=dict)(file)
    with pytest.raises(DefinitionError, match="requires_approval"):
        box.tool("third", read_only=True, description="x", replies=REPLIES)(file)
    flow = durable.CodeWorkflow("unit_sensitive_agent", version=1, toolbox=box)
    try:
        assert flow.sensitive_calls() == {
            "file": Sensitive("note", readers=["auth.view_user"]),
            "fourth": Sensitive("story"),
        }
        assert flow.replies_of("file") is REPLIES
    finally:
        unregister(flow)


# --- masking by value ---------------------------------------------------------------------------
SECRET = 'He said "no" — twice'


def test_redactor__the_whole_value_becomes_its_size_and_copies_inside_texts_are_masked() -> None:
    masked = Redactor([SECRET]).value(
        {
            "details": SECRET,
            "error": f"partner refused: {SECRET}.",
            "tool_call": json.dumps({"note": SECRET}),  # as a model's arguments hold it
            "ascii": json.dumps({"note": SECRET}, ensure_ascii=True),
            "list": [SECRET, 3],
        }
    )

    assert masked["details"] == redacted(SECRET) == "redacted (20 characters)"
    assert masked["error"] == "partner refused: redacted (20 characters)."
    assert masked["tool_call"] == '{"note": "redacted (20 characters)"}'
    assert masked["ascii"] == '{"note": "redacted (20 characters)"}'
    assert masked["list"] == ["redacted (20 characters)", 3]


def test_redactor__whole_words_only_and_nothing_without_values() -> None:
    assert (
        Redactor(["flu"]).text("influence, not flu.") == "influence, not redacted (3 characters)."
    )
    assert Redactor([]).value({"a": "flu"}) == {"a": "flu"}
    assert not Redactor([" ", ""])


NOTE = "The ward nurse, Ingrid-Q5, told me on Monday to stay in bed for a week."


@pytest.mark.parametrize(
    ("shown", "expected"),
    [
        # a divergence's excerpt around its first difference, cut on both sides
        (
            f"messages[1].content: …{NOTE[10:70]}… → …",
            f"messages[1].content: …{redacted(NOTE)}… → …",
        ),
        # cut with a preview's ellipsis, as JSON writes it
        (f'{{"note": "{NOTE[:30]}…"}}', f'{{"note": "{redacted(NOTE)}…"}}'),
        # an error cut at its column's size: the copy ends the text
        (f"partner refused: {NOTE[:40]}", f"partner refused: {redacted(NOTE)}"),
        # fewer than MIN_CUT_CHARS beside a cut say nothing, and are left alone
        (f"to stay… {NOTE[:5]}", f"to stay… {NOTE[:5]}"),
        ("nothing of it … here", "nothing of it … here"),
    ],
)
def test_redactor__a_copy_cut_before_it_was_kept_is_masked_too(shown: str, expected: str) -> None:
    assert Redactor([NOTE]).text(shown) == expected


# --- the decision form --------------------------------------------------------------------------
def form(data: dict[str, Any] | None = None, **kwargs: Any) -> DecisionForm:
    return DecisionForm(data, replies=kwargs.pop("replies", REPLIES), approved=False, **kwargs)


def test_decision_form__offers_the_outcomes_sentences_then_own_words() -> None:
    shown = form()

    choices = [value for value, _ in shown.fields["reply"].choices]  # type: ignore[attr-defined]
    assert choices == ["Sorry, no.", "Sorry, not without papers.", OWN_WORDS]
    assert shown.fields["reply"].initial == "Sorry, no."
    assert "never shown to the customer" in str(shown.fields["reason"].help_text)


def test_decision_form__ready_only_once_the_preview_is_confirmed() -> None:
    data = {"reason": "internal note", "reply": "Sorry, not without papers."}

    assert form(data).is_valid() and not form(data).ready
    confirmed = form({**data, "confirmed": "yes"})
    assert confirmed.ready and confirmed.reply_text == "Sorry, not without papers."


def test_decision_form__own_words_required_when_chosen_and_kept_as_one_paragraph() -> None:
    data = {"reason": "x", "reply": OWN_WORDS, "confirmed": "yes"}

    assert not form({**data, "own_words": "  "}).is_valid()
    written = form({**data, "own_words": " We need\n the certificate. "})
    assert written.ready and written.reply_text == "We need the certificate."


def test_decision_form__a_call_declaring_no_replies_asks_the_reason_alone() -> None:
    plain = form({"reason": "fine"}, replies=None)

    assert set(plain.fields) == {"reason"}
    assert plain.ready and plain.reply_text == ""
