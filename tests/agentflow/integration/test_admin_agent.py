"""The operator's side of agent mode on real Postgres and Redis: an agent run's trajectory as
a conversation on its run page (turns, tool calls, results, tokens spent and saved by replay,
resumes, the divergence diff, superseded branches), and Fork from a position with its
confirmation, refusals and permissions. Runs are made by the engine itself (`drive`)."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db.models import F
from django.test import Client
from django.utils import timezone

from agentflow import _store as store
from agentflow import durable
from agentflow._base.states import RunStatus, StepKind, StepStatus
from agentflow._engine import runtime
from agentflow._recovery import sweeper
from agentflow.agent import loop as agent_loop
from agentflow.models import RunEvent, StepCheckpoint, SupersededStep, WorkflowRun
from tests.support import partner, workflows
from tests.support.admin import detail_url, text

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("engine")]

Drive = Callable[[str], WorkflowRun]


# --- reading the page ---------------------------------------------------------------------------
def words(markup: str) -> str:
    """The text a person reads: tags dropped (blocks apart), entities decoded, spaces collapsed."""
    inline = re.sub(r"</?(?:code|span|strong|a)\b[^>]*>", "", markup)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", inline)).split())


def conversation(page: str, *, branch: int | None = None) -> dict[int, str]:
    """Each call's markup by position: the current branch's, or a superseded branch's."""
    section = page.split('<section class="module af-trajectory"', 1)[1]
    if branch is None:
        part = section.split('<details class="af-branch"', 1)[0]
    else:
        part = section.split(f'<details class="af-branch" data-branch="{branch}">', 1)[1]
        part = part.split("</details>", 1)[0]
    calls = {}
    for piece in part.split('<li class="af-call ')[1:]:
        position = int(re.search(r'data-position="(\d+)"', piece).group(1))  # type: ignore[union-attr]
        calls[position] = piece.split(">", 1)[1].split("\n</li>", 1)[0]
    return calls


def figure(page: str, label: str) -> str:
    found = re.search(rf"<dt>{re.escape(label)}</dt><dd>([^<]*)</dd>", page)
    assert found, f"no figure {label!r} on the page"
    return found.group(1)


def tokens(run_id: str) -> dict[int, int]:
    """Each model turn's recorded total tokens, by position."""
    return {
        cp.seq: cp.output["usage"]["total_tokens"]
        for cp in StepCheckpoint.objects.filter(run_id=run_id, name="llm").order_by("seq")
    }


def saved_by_replay(run_id: str, *, finished: bool) -> int:
    """The definition, from the rows: each turn's tokens times the task executions at later
    positions (their attempts), plus the task that saw the function return."""
    attempts = dict(StepCheckpoint.objects.filter(run_id=run_id).values_list("seq", "attempts"))
    return sum(
        total * (sum(n for q, n in attempts.items() if q > p) + int(finished))
        for p, total in tokens(run_id).items()
    )


# --- runs in the shapes the engine leaves them --------------------------------------------------
def diverged_drift_run(drive: Drive) -> str:
    """The drifting agent: turns 1-2 and the buy recorded, then a prompt change makes the next
    task's replay find turn 2 (position 4) recorded with other messages."""
    run_id = durable.start(workflows.drift_agent.name)
    partner.release(f"{run_id}/buy")
    for seq in (1, 2, 3, 4, 5):
        runtime.run_step(run_id, seq)
    partner.release(workflows.prompt_changed(run_id))
    assert drive(run_id).status == RunStatus.NEEDS_ATTENTION
    return run_id


def lost_claim(run_id: str, seq: int) -> None:
    """The call at `seq` was claimed by a worker that vanished before doing anything."""
    run = WorkflowRun.objects.get(pk=run_id)
    outcome = agent_loop.replay(
        workflows.agent,
        run_id=run_id,
        input=run.input,
        seq=seq,
        branch=run.branch,
        recorded=store.replay_load(run_id, seq + 1),
        reusable=lambda: [],
        calls=lambda: store.calls_load(run_id, seq + 1),
    )
    assert isinstance(outcome, agent_loop.NextCall)
    state = store.state_load(run_id, seq)
    assert state is not None and store.step_claim(state, outcome.step, seq, None) is not None
    a_minute_ago = timezone.now() - timedelta(minutes=1)
    StepCheckpoint.objects.filter(run_id=run_id, seq=seq).update(
        lease_expires_at=a_minute_ago, lease_lock=None, lease_owner="celery@gone:1:x"
    )
    WorkflowRun.objects.filter(pk=run_id).update(wake_at=a_minute_ago)


# --- the conversation ---------------------------------------------------------------------------
def test_conversation__completed_agent_run__messages_calls_results_and_tokens(
    admin_client: Client, drive: Drive
) -> None:
    run = drive(durable.start(workflows.agent.name))
    assert run.status == RunStatus.COMPLETED

    page = text(admin_client.get(detail_url(run)))

    calls = conversation(page)
    assert sorted(calls) == [1, 2, 3, 4, 5, 6]
    spent = tokens(run.pk)
    first = words(calls[1])
    assert first.startswith("system You buy fruit. user apples #1 Model · turn 1")
    assert f"{spent[1]} tokens" in first
    assert 'asked for 2 tool calls: lookup {"item": "apple"} lookup {"item": "pear"}' in first
    assert words(calls[2]).startswith(
        '#2 Tool lookup read-only replayed 5 times arguments {"item": "apple"} '
        'returned {"item": "apple", "price": 3}'
    )
    assert 'returned {"item": "pear", "price": 5}' in words(calls[3])
    assert 'asked for 1 tool call: buy {"item": "apple", "qty": 2}' in words(calls[4])
    buy = words(calls[5])
    key = durable.idempotency_key(run.pk, 5)
    assert buy.startswith(
        '#5 Tool buy side effect replayed 2 times arguments {"qty": 2, "item": "apple"}'
    )
    assert f'"key": "{key}"' in buy and f"key {key}" in buy
    assert words(calls[6]).startswith("#6 Model, final answer · turn 3")
    assert "Bought 2 apples at $3." in words(calls[6])
    # Tokens spent per turn and in all; saved: turn 1 was handed back by the tasks at
    # positions 2-6 and the one that saw the function return, turn 2 by 5, 6 and that one...
    assert f"replayed 6 times, saved {spent[1] * 6:,}" in first
    assert f"replayed 3 times, saved {spent[4] * 3:,}" in words(calls[4])
    assert f"replayed 1 time, saved {spent[6]:,}" in words(calls[6])
    assert figure(page, "tokens spent") == f"{sum(spent.values()):,}"
    saved = spent[1] * 6 + spent[4] * 3 + spent[6]
    assert saved == saved_by_replay(run.pk, finished=True)
    assert figure(page, "tokens saved by replay") == f"{saved:,}"
    assert f"{saved:,} tokens in all." in words(page)
    assert "No resume: every task ran once" in page
    assert 'class="af-fork-link"' not in page  # a completed run is not forked


def test_conversation__a_failed_run__its_compensation_and_on_failure_step(
    admin_client: Client, drive: Drive
) -> None:
    run = drive(durable.start(workflows.agent.name, input={"fail_after_buy": True}))
    assert run.status == RunStatus.FAILED

    page = text(admin_client.get(detail_url(run)))

    calls = conversation(page)
    assert sorted(calls) == [1, 2, 3, 4, 5, 7, 8]  # 6 was the function's next call's
    undo = words(calls[7])
    assert undo.startswith("#7 Compensation refund@5 side effect")
    assert "undoes the call at #5 arguments" not in undo  # it recorded no call of its own
    assert "undoes the call at #5" in undo and '"refunded": "apple"' in undo
    assert words(calls[8]).startswith("#8 Step tell effect")
    # Fork is offered on a failed agent run (the store still decides).
    assert 'class="af-tool-fork"' in page


def test_conversation__a_refused_call_and_a_step_in_code(
    admin_client: Client, drive: Drive
) -> None:
    """The rows as the engine records them: a call the registry refused (invalid arguments),
    which ran nothing and whose reason is the model's result; and a `ctx.step`."""
    run = drive(durable.start(workflows.agent.name))
    asked = {"item": "apple", "qty": "two"}
    refused = workflows.shop.prepare("buy", asked).refused
    assert refused is not None
    rows = StepCheckpoint.objects.filter(run=run)
    rows.filter(seq=5).update(
        kind=StepKind.READ,
        arguments={"position": 5, "kind": "tool", "name": "buy", "arguments": asked},
        output=refused.as_json(),
    )
    rows.filter(seq=3).update(
        name="verify_ownership",
        arguments={"position": 3, "kind": "step", "name": "verify_ownership", "arguments": None},
        output={"owner": True},
    )

    page = text(admin_client.get(detail_url(run)))

    calls = conversation(page)
    said = words(calls[5])
    assert said.startswith('#5 Tool buy read-only replayed 2 times arguments {"qty": "two"')
    assert 'refused: nothing ran { "error": "invalid_arguments", "message": "buy was not' in said
    assert (
        '"problems": [ { "field": "qty", "problem": "Input should be a valid integer" } ]' in said
    )
    assert re.search(r'<li class="af-call af-part-tool af-refused" data-position="5"', page)
    assert (
        words(calls[3]) == '#3 Step verify_ownership read replayed 4 times returned {"owner": true}'
    )


def test_conversation__a_takeover_after_a_sweep__says_what_its_replay_handed_back(
    admin_client: Client, drive: Drive
) -> None:
    run_id = durable.start(workflows.agent.name)
    for seq in (1, 2, 3, 4):
        runtime.run_step(run_id, seq)
    lost_claim(run_id, 5)
    assert sweeper.sweep().requeued == [run_id]  # the sweeper re-publishes position 5...
    run = drive(run_id)  # ...whose task takes the buy over (attempt 2) and goes on
    assert run.status == RunStatus.COMPLETED
    assert StepCheckpoint.objects.get(run_id=run_id, seq=5).attempts == 2
    assert partner.effects() == {durable.idempotency_key(run_id, 5): 1}

    page = text(admin_client.get(detail_url(run)))

    spent = tokens(run_id)
    resumes = [words(r) for r in re.findall(r'<li class="af-resume"[^>]*>(.*?)</li>', page, re.S)]
    assert len(resumes) == 1
    assert (
        f"Attempt 2 of position 5 replayed positions 1-4 (2 model turns, "
        f"{spent[1] + spent[4]:,} tokens, 2 tool calls) without asking the model or calling a "
        "tool. Re-published by the sweeper, then took over: its worker's lease ran out."
    ) in resumes[0]
    saved = saved_by_replay(run_id, finished=True)
    assert saved == spent[1] * 7 + spent[4] * 4 + spent[6]  # attempt 2 replayed turns 1 and 2
    assert figure(page, "tokens saved by replay") == f"{saved:,}"
    assert "2 attempts" in words(conversation(page)[5])


def test_conversation__diverged_run__shows_the_diff_and_offers_fork_from_there(
    admin_client: Client, drive: Drive
) -> None:
    run_id = diverged_drift_run(drive)

    page = text(admin_client.get(detail_url(WorkflowRun.objects.get(pk=run_id))))

    box = page.split('<div class="af-divergence" id="af-divergence">', 1)[1].split("</div>", 1)[0]
    said = words(box)
    assert said.startswith("Diverged at position 4")
    assert "Position 4 diverged: the model turn (scripted-shopper) changed." in said
    note = json.dumps({"content": workflows.PRICES_NOTE, "role": "user"}, ensure_ascii=False)
    assert f"arguments.messages[5] — → {note}" in said
    fork_url = detail_url(WorkflowRun.objects.get(pk=run_id), "fork")
    assert f'href="{fork_url}?position=4"' in box
    assert "Fork from position 4…" in said
    assert "Diverged from its recorded history:" in words(page)  # the callout at the top
    # The diverged turn is still shown as recorded, and each position can be forked.
    assert "#4 Model · turn 2" in words(conversation(page)[4])
    assert page.count('class="af-fork-link"') == 6  # positions 1-5 and after the last call
    # The timeline marks the divergence on the position that diverged.
    assert re.search(
        r'class="af-tl-mark af-tl-mark-diverged" data-kind="diverged" data-seq="4"', page
    )


def test_fork__confirmation_lists_the_completed_effect_then_the_run_reuses_it(
    admin_client: Client, drive: Drive
) -> None:
    run_id = diverged_drift_run(drive)
    key = durable.idempotency_key(run_id, 5)
    url = detail_url(WorkflowRun.objects.get(pk=run_id), "fork")

    confirm = text(admin_client.get(f"{url}?position=4"))

    effects = words(
        confirm.split('aria-labelledby="af-effects-heading">', 1)[1].split("</section>", 1)[0]
    )
    assert effects.startswith("1 side effect of the part set aside happened")
    assert "it stays happened after the fork" in effects
    assert "should the run later fail, it is undone with the new branch's own calls" in effects
    assert '#5 buy {"qty": 2, "item": "apple"}' in effects and key in effects
    aside = words(confirm.split('id="af-aside-heading">', 1)[1].split("</section>", 1)[0])
    assert aside.startswith("Set aside as branch 0: 2 calls")
    assert "1 model turn" in aside and "#4 model turn" in aside and "#5 buy" in aside
    assert 'name="position" value="4"' in confirm
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.NEEDS_ATTENTION  # GET: nothing

    response = admin_client.post(url, {"position": "4", "reason": "new prompt is right (T-9)"})

    assert response.status_code == 302
    said = [m.message for m in response.wsgi_request._messages]  # type: ignore[attr-defined]
    assert said == [f"Run {run_id}: forked from position 4; it continues there on branch 1."]
    run = drive(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert partner.effects() == {key: 1}  # the buy was adopted, not made again
    fork = RunEvent.objects.get(run_id=run_id, kind=RunEvent.Kind.FORK)
    assert fork.actor == "admin" and fork.detail.startswith("new prompt is right (T-9)")

    page = text(admin_client.get(detail_url(run)))

    current = conversation(page)
    assert (
        f"Adopted the recorded result of an identical call of a superseded branch (key {key})"
        in words(current[5])
    )
    assert "side effect" in words(current[5])
    old = conversation(page, branch=0)
    assert sorted(old) == [4, 5]
    assert "Adopted by the new branch at #5: not made again." in words(old[5])
    summary = re.search(r'data-branch="0">\s*<summary>(.*?)</summary>', page, re.S)
    assert summary
    forked_at = timezone.localtime(fork.at).strftime("%Y-%m-%d %H:%M:%S")
    assert words(summary.group(1)).startswith(
        f"Branch 0, positions 4-5: superseded by the fork of {forked_at} by admin"
    )
    assert "1 side effect made, adopted by a later branch" in words(summary.group(1))
    assert "Reason: new prompt is right (T-9)" in words(page)
    assert "answered by the fork of" in words(page)
    assert re.search(r'class="af-tl-mark af-tl-mark-fork" data-kind="fork"', page)
    assert 'data-outcome="superseded"' in page  # the set-aside attempts stay on the timeline
    assert "Forked by an operator" in page  # the event, in the run's history


def test_fork__refused_for_a_graph_run_and_past_an_unknown_outcome__as_messages(
    admin_client: Client, drive: Drive
) -> None:
    graph = drive(durable.start(workflows.declined.name))
    agent = durable.start(workflows.agent.name)
    for seq in (1, 2, 3, 4):
        runtime.run_step(agent, seq)
    now = timezone.now()  # the buy was in flight when its worker died; nobody can say more
    StepCheckpoint.objects.create(
        run_id=agent,
        seq=5,
        name="buy",
        kind=StepKind.EFFECT,
        status=StepStatus.IN_PROGRESS,
        attempts=1,
        idempotency_key=durable.idempotency_key(agent, 5),
        lease_expires_at=now,
        first_started_at=now,
        started_at=now,
        arguments={"kind": "tool", "name": "buy", "position": 5, "arguments": {}},
    )
    assert store.run_park(agent, 5, "outcome unknown: buy", fence=1)

    refused_graph = admin_client.post(
        detail_url(graph, "fork"), {"position": "1", "reason": "try"}, follow=True
    )
    unknown = text(
        admin_client.get(detail_url(WorkflowRun.objects.get(pk=agent), "fork") + "?position=4")
    )
    refused_unknown = admin_client.post(
        detail_url(WorkflowRun.objects.get(pk=agent), "fork"),
        {"position": "4", "reason": "try"},
        follow=True,
    )

    assert refused_graph.status_code == 200
    assert f"Run {graph.pk} was not forked: only agent (agent) runs can be forked." in words(
        text(refused_graph)
    )
    assert "Whether buy (position 5) took effect is unknown" in words(unknown)
    assert refused_unknown.status_code == 200
    assert f"Run {agent} was not forked: whether buy (position 5) took effect is unknown" in words(
        text(refused_unknown)
    )
    assert not SupersededStep.objects.exists()
    assert not RunEvent.objects.filter(kind=RunEvent.Kind.FORK).exists()
    # A graph run's page has no conversation and no Fork; asking for its fork page says why.
    page = text(admin_client.get(detail_url(graph)))
    assert 'class="module af-trajectory"' not in page and 'class="af-tool-fork"' not in page
    said = words(text(admin_client.get(detail_url(graph, "fork") + "?position=1", follow=True)))
    assert f"Run {graph.pk} cannot be forked: only diverged, parked or failed agent" in said


@pytest.mark.parametrize("position", ["", "0", "7", "x", "9" * 5000])
def test_fork__a_position_out_of_range_or_garbage__a_message_not_an_error(
    admin_client: Client, drive: Drive, position: str
) -> None:
    run_id = diverged_drift_run(drive)
    url = detail_url(WorkflowRun.objects.get(pk=run_id), "fork")

    shown = admin_client.get(url, {"position": position}, follow=True)
    posted = admin_client.post(url, {"position": position, "reason": "x"}, follow=True)

    for response in (shown, posted):
        assert response.status_code == 200
        assert f"Choose a position to fork run {run_id} from: a number from 1 to 6." in words(
            text(response)
        )
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.NEEDS_ATTENTION


def test_fork__needs_a_reason(admin_client: Client, drive: Drive) -> None:
    run_id = diverged_drift_run(drive)

    response = admin_client.post(
        detail_url(WorkflowRun.objects.get(pk=run_id), "fork"), {"position": "4", "reason": "  "}
    )

    assert response.status_code == 200
    assert "Please give a reason" in text(response)
    assert WorkflowRun.objects.get(pk=run_id).branch == 0


def test_fork__a_viewer_sees_no_fork_and_a_forged_post_is_refused(
    viewer: Client, drive: Drive
) -> None:
    run_id = diverged_drift_run(drive)
    run = WorkflowRun.objects.get(pk=run_id)

    page = text(viewer.get(detail_url(run)))
    shown = viewer.get(detail_url(run, "fork"), {"position": "4"})
    forged = viewer.post(detail_url(run, "fork"), {"position": "4", "reason": "forged"})

    assert "Position 4 diverged" in page  # may read the conversation and the diff...
    for link in ('"af-fork-link"', 'af-fork-button"', '"af-tool-fork"', "/fork/"):
        assert link not in page  # ...but is offered no fork
    assert (shown.status_code, forged.status_code) == (403, 403)
    run.refresh_from_db()
    assert (run.status, run.branch) == (RunStatus.NEEDS_ATTENTION, 0)


# --- odd data -----------------------------------------------------------------------------------
def test_odd_data__checkpoints_and_events_in_unexpected_shapes_never_break_the_page(
    admin_client: Client, drive: Drive
) -> None:
    run = drive(durable.start(workflows.agent.name))
    huge = "x" * 5_000_000
    rows = StepCheckpoint.objects.filter(run=run)
    rows.filter(seq=1).update(arguments=None, output={"usage": "lots", "message": [1, 2]})
    rows.filter(seq=2).update(
        arguments=[1, 2, 3], output={"ok": True, "result": {"html": "<script>alert(1)</script>"}}
    )
    rows.filter(seq=3).update(
        arguments={"kind": "tool", "arguments": ["not", "an", "object"]}, output=huge
    )
    rows.filter(seq=4).update(
        arguments={"kind": "llm", "arguments": {"messages": "nope"}},
        output={
            "message": {"content": {"parts": [1]}, "tool_calls": [{"function": 7}, "junk"]},
            "usage": {"total_tokens": -3},
        },
    )
    rows.filter(seq=5).update(arguments={"kind": "tool", "name": "buy"}, output=None)
    rows.filter(seq=6).update(arguments="llm", output={"message": {"content": huge}})
    now = timezone.now()
    for kind, data in [
        (RunEvent.Kind.DIVERGENCE, None),
        (RunEvent.Kind.DIVERGENCE, {"position": "4", "changes": [None, {"path": 7}], "more": "x"}),
        (RunEvent.Kind.FORK, {"position": None, "branch": "one"}),
        (RunEvent.Kind.TAKEOVER, {"attempt": "2", "reason": 5}),
        (RunEvent.Kind.ATTEMPT_FAILED, [1]),
    ]:
        RunEvent.objects.create(run=run, kind=kind, seq=5, data=data, detail="odd")
    WorkflowRun.objects.filter(pk=run.pk).update(branch=F("branch") + 1)
    SupersededStep.objects.create(
        run=run,
        branch=7,
        seq=2,
        name="lookup",
        kind="read",
        status="COMPLETED",
        attempts=1,
        idempotency_key="k-odd",
        arguments={"kind": "tool", "reused": "yes"},
        output=huge,
        superseded_at=now,
    )
    SupersededStep.objects.create(
        run=run,
        branch=0,
        seq=3,
        name="llm",
        kind="llm",
        status="COMPLETED",
        attempts=0,
        idempotency_key="k-odd-2",
        arguments=None,
        output=None,
        superseded_at=now,
    )

    response = admin_client.get(detail_url(run))

    assert response.status_code == 200
    page = text(response)
    assert "could not be read" not in page  # read, with notes, not given up
    assert len(response.content) < 1_500_000  # 5 MB values are previews, not the page
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    calls = conversation(page)
    assert "Its request is not recorded in the expected shape." in words(calls[1])
    assert "Its answer is not recorded in the expected shape." in words(calls[1])
    assert "(5.0 MB in all)" in words(calls[3])
    assert "A tool call it asked for is not in the expected shape." in words(calls[4])
    assert "Its token usage is not recorded in the expected shape." in words(calls[4])
    assert "Its result is not recorded." in words(calls[5])
    assert "5,000,000 characters in all" in words(calls[6])
