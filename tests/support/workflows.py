"""Workflow definitions the engine tests run, in the test process and in worker processes.

Workers import this module through `AGENTFLOW_WORKFLOW_MODULES=tests.support.workflows`.
Every step body records its execution at the partner stand-in first; effect steps then call the
partner with the step's idempotency key, so tests count executions and effects outside Postgres.
"""

from __future__ import annotations

import os
from typing import Any

from agentflow import durable
from agentflow._core import faults
from tests.support import partner


def _record(ctx: durable.StepContext) -> int:
    """Record this execution; returns which execution of the step it is (1, 2, ...)."""
    return partner.record_execution(ctx.run_id, ctx.seq, ctx.step, ctx.attempt)


def read(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    return {"step": ctx.step, "seq": ctx.seq}


def effect(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    return partner.apply(ctx.idempotency_key)


def held_effect(ctx: durable.StepContext) -> dict[str, Any]:
    """Blocks until the test releases the run, then calls the partner.

    It deliberately ignores `ctx.lease_lost`, so a worker that was paused past its lease goes on
    to complete late: the fencing, not the step's manners, must keep that harmless.
    """
    _record(ctx)
    partner.wait_for_release(ctx.run_id)
    return partner.apply(ctx.idempotency_key)


def held_read(ctx: durable.StepContext) -> dict[str, Any]:
    """Blocks until the test releases the run: meanwhile the run's last commit is the step's
    before it (a read takes no claim)."""
    _record(ctx)
    partner.wait_for_release(ctx.run_id)
    return {"step": ctx.step, "seq": ctx.seq}


def _finish(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    return {"seen": sorted(ctx.outputs)}


#: read -> effect -> read: the fault-injection target is `charge`.
chain = durable.Workflow("crash_chain", version=1)
chain.step("prepare", kind="read")(read)
chain.step("charge", kind="effect")(effect)
chain.step("finish", kind="read")(_finish)

#: read -> blocking effect -> read: the test kills or pauses whoever runs `hold`.
held = durable.Workflow("crash_held", version=1)
held.step("prepare", kind="read")(read)
held.step("hold", kind="effect")(held_effect)
held.step("finish", kind="read")(_finish)

#: read -> effect -> blocking read: the test crashes the server while the run is not finished.
lingering = durable.Workflow("crash_lingering", version=1)
lingering.step("prepare", kind="read")(read)
lingering.step("charge", kind="effect")(effect)
lingering.step("linger", kind="read")(held_read)

#: The blocking effect first, so two copies of the first message can race for it.
race = durable.Workflow("crash_race", version=1)
race.step("hold", kind="effect")(held_effect)
race.step("finish", kind="read")(_finish)

#: Ten steps, alternating read and effect: the load test.
ten = durable.Workflow("crash_ten", version=1)
for _index in range(10):
    ten.step(f"s{_index}", kind="read" if _index % 2 == 0 else "effect")(
        read if _index % 2 == 0 else effect
    )


# --- failures -----------------------------------------------------------------------------------
def flaky_effect(ctx: durable.StepContext) -> dict[str, Any]:
    """Fails like a 503 on the first attempt; the retry uses the same idempotency key."""
    _record(ctx)
    if ctx.attempt == 1:
        raise durable.RetryableStepError("partner said 503")
    return partner.apply(ctx.idempotency_key)


def declined_effect(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    raise durable.PermanentStepError("card declined")


def not_json(ctx: durable.StepContext) -> Any:
    _record(ctx)
    return {"tags": {"a", "b"}}  # a set: not JSON


def gated_effect(ctx: durable.StepContext) -> dict[str, Any]:
    """Refused for good until the test releases the run (an operator fixed the account)."""
    _record(ctx)
    if not partner.is_released(ctx.run_id):
        raise durable.PermanentStepError("partner refused: account locked")
    return partner.apply(ctx.idempotency_key)


def dormant_effect(ctx: durable.StepContext) -> dict[str, Any]:
    """Fails like a 503 on the first attempt, with a back-off of about an hour."""
    _record(ctx)
    if ctx.attempt == 1:
        raise durable.RetryableStepError("partner said 503, retry in an hour")
    return partner.apply(ctx.idempotency_key)


flaky = durable.Workflow("crash_flaky", version=1)
flaky.step("charge", kind="effect", retry=durable.RetryPolicy(base_seconds=2.0))(flaky_effect)
flaky.step("finish", kind="read")(_finish)

#: Fails permanently until released: the operator's Retry then completes it.
gated = durable.Workflow("crash_gated", version=1)
gated.step("prepare", kind="read")(read)
gated.step("charge", kind="effect")(gated_effect)
gated.step("finish", kind="read")(_finish)

#: Backs off for an hour after its first attempt: only the sweeper (or Resume now) wakes it.
dormant = durable.Workflow("crash_dormant", version=1)
dormant.step(
    "charge", kind="effect", retry=durable.RetryPolicy(base_seconds=3600, max_seconds=3600)
)(dormant_effect)
dormant.step("finish", kind="read")(_finish)

declined = durable.Workflow("crash_declined", version=1)
declined.step("prepare", kind="read")(read)
declined.step("charge", kind="effect")(declined_effect)

bad_output = durable.Workflow("crash_bad_output", version=1)
bad_output.step("prepare", kind="read")(read)
bad_output.step("summarise", kind="read")(not_json)
bad_output.step("finish", kind="read")(_finish)

#: An effect whose result cannot be stored: it happened, so the run must not just fail.
bad_effect_output = durable.Workflow("crash_bad_effect_output", version=1)


@bad_effect_output.step("charge", kind="effect", compensate="refund")
def effect_then_not_json(ctx: durable.StepContext) -> Any:
    effect(ctx)
    return {"charged": {"a", "set"}}


bad_effect_output.compensation("refund")(effect)

#: Two effects with compensations, then a permanent failure: undo latest first, then notify.
undo = durable.Workflow("crash_undo", version=1, on_failure="notify")
undo.step("book", kind="effect", compensate="unbook")(effect)
undo.step("charge", kind="effect", compensate="refund")(effect)
undo.step("confirm", kind="effect")(declined_effect)
undo.compensation("unbook")(effect)
undo.compensation("refund")(effect)
undo.compensation("notify")(effect)

#: A deploy under a running run: a worker started with TEST_WORKFLOWS_DEPLOY=2 has only v2.
DEPLOYED_VERSION = int(os.environ.get("TEST_WORKFLOWS_DEPLOY", "1"))
deployed = durable.Workflow("crash_deployed", version=DEPLOYED_VERSION)
deployed.step("prepare", kind="read")(read)
deployed.step("charge" if DEPLOYED_VERSION == 1 else "charge_v2", kind="effect")(effect)


# --- engine hardening ---------------------------------------------------------------------------
def aba_effect(ctx: durable.StepContext) -> dict[str, Any]:
    """Execution 1 holds (the owner the test pauses), execution 2 is refused by the partner
    (the takeover fails for good), execution 3 holds again (the operator's retry, in flight
    while the paused owner wakes)."""
    execution = _record(ctx)
    if execution == 2:
        raise durable.PermanentStepError("card declined")
    partner.wait_for_release(f"{ctx.run_id}/{execution}")
    return partner.apply(ctx.idempotency_key)


aba = durable.Workflow("crash_aba", version=1)
aba.step("prepare", kind="read")(read)
aba.step("charge", kind="effect")(aba_effect)
aba.step("finish", kind="read")(_finish)


def suicide(ctx: durable.StepContext) -> dict[str, Any]:
    """A read step that kills its own worker process every time it runs."""
    import signal

    _record(ctx)
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


suicidal = durable.Workflow("crash_suicidal", version=1)
suicidal.step("prepare", kind="read")(read)
suicidal.step("die", kind="read")(suicide)


def slow_db(ctx: durable.StepContext) -> dict[str, Any]:
    """A db step that holds (inside its transaction, under the run's row lock) until released."""
    _record(ctx)
    partner.wait_for_release(f"{ctx.run_id}/db")
    return {"written": True}


slow_db_flow = durable.Workflow("crash_slow_db", version=1)
slow_db_flow.step("write", kind="db")(slow_db)
slow_db_flow.step("finish", kind="read")(_finish)


def patient_effect(ctx: durable.StepContext) -> dict[str, Any]:
    """Asks to be retried in 3 s on its first attempt (Retry-After), then makes its effect."""
    _record(ctx)
    if ctx.attempt == 1:
        raise durable.RetryableStepError("partner said 503", retry_after_seconds=3.0)
    return partner.apply(ctx.idempotency_key)


patient = durable.Workflow("crash_patient", version=1)
patient.step("charge", kind="effect", retry=durable.RetryPolicy(base_seconds=0.1))(patient_effect)
patient.step("finish", kind="read")(_finish)


def greedy_effect(ctx: durable.StepContext) -> dict[str, Any]:
    """A partner whose Retry-After is whatever the test put in the run's input."""
    _record(ctx)
    raise durable.RetryableStepError(
        "partner said 429", retry_after_seconds=float(ctx.input["retry_after"])
    )


greedy = durable.Workflow("crash_greedy", version=1)
greedy.step("charge", kind="effect")(greedy_effect)


#: Two effects with compensations, then a partner that asks to wait: what an operator cancels.
def find_effect(ctx: durable.StepContext) -> dict[str, Any] | None:
    """Reconcile: the partner's effect under this step's key, or None; its ledger is
    consistent, so none proves the effect did not happen."""
    if partner.effects()[ctx.idempotency_key]:
        return {"key": ctx.idempotency_key, "replayed": True}
    return None


def answer_lost_effect(ctx: durable.StepContext) -> dict[str, Any]:
    """Applied at the partner, then on the first attempt its answer is lost (a timeout after
    the request went out): the step backs off while the effect stands."""
    _record(ctx)
    applied = partner.apply(ctx.idempotency_key)
    if ctx.attempt == 1:
        raise durable.RetryableStepError("read timed out after the request was sent")
    return applied


def undo_effect(ctx: durable.StepContext) -> dict[str, Any]:
    """A compensation that says which call the engine handed it to undo."""
    _record(ctx)
    undone = ctx.undoes.idempotency_key if ctx.undoes is not None else None
    return {**partner.apply(ctx.idempotency_key), "undoes": undone}


cancellable = durable.Workflow("crash_cancellable", version=1, on_failure="notify")
cancellable.step("book", kind="effect", compensate="unbook")(effect)
cancellable.step("charge", kind="effect", compensate="refund")(effect)
cancellable.step(
    "confirm", kind="effect", retry=durable.RetryPolicy(base_seconds=30), reconcile=find_effect
)(flaky_effect)
cancellable.compensation("unbook")(effect)
cancellable.compensation("refund")(effect)
cancellable.compensation("notify")(effect)

#: The charge is taken and its answer lost; it backs off while an operator cancels.
lost_answer = durable.Workflow("crash_lost_answer", version=1, on_failure="notify")
lost_answer.step("book", kind="effect", compensate="unbook")(effect)
lost_answer.step(
    "charge",
    kind="effect",
    compensate="refund",
    reconcile=find_effect,
    retry=durable.RetryPolicy(base_seconds=30),
)(answer_lost_effect)
lost_answer.step("confirm", kind="effect")(effect)
lost_answer.compensation("unbook")(undo_effect)
lost_answer.compensation("refund")(undo_effect)
lost_answer.compensation("notify")(effect)


# --- agent mode (agent runs) -----------------------------------------------------------
from agentflow.agent import (  # noqa: E402  (grouped with the agent workflow it serves)
    ModelRequest,
    ScriptedModel,
    Toolbox,
    ToolContext,
    answer,
    call,
    calls,
    system_message,
    tool_result_message,
    user_message,
)

PRICES = {"apple": 3, "pear": 5}
shop = Toolbox("crash_agent")


def _record_tool(ctx: ToolContext) -> int:
    return partner.record_execution(ctx.run_id, ctx.position, ctx.tool, ctx.attempt)


@shop.tool("lookup", read_only=True, description="The price of an item, in dollars.")
def lookup(ctx: ToolContext, item: str) -> dict[str, Any]:
    _record_tool(ctx)
    return {"item": item, "price": PRICES[item]}


@shop.tool("buy", side_effect=True, compensate="refund", description="Buy an item.")
def buy(ctx: ToolContext, item: str, qty: int) -> dict[str, Any]:
    _record_tool(ctx)
    return {"item": item, "qty": qty, **partner.apply(ctx.idempotency_key)}


@shop.compensation("refund")
def refund_purchase(ctx: ToolContext, item: str) -> dict[str, Any]:
    _record_tool(ctx)
    return {"refunded": item, **partner.apply(ctx.idempotency_key)}


def shopping_plan(request: ModelRequest) -> Any:
    """Turn 1: look both prices up at once; turn 2: buy two of the cheaper; then answer. Unless
    the run's input says `fail_after_buy`, which the function checks in code, or its `ask`
    (the user message) plays a hostile model: "nothing" answers at once, "greedy" buys with
    bad arguments, then twice, "flood" asks for twelve lookups in one turn."""
    ask = next(m["content"] for m in request.messages if m.get("role") == "user")
    if ask == "nothing":
        return answer("Bought 2 apples at $3.")
    if request.turn == 1:
        if ask == "flood":
            return calls(*(call("lookup", item="apple") for _ in range(12)))
        return calls(call("lookup", item="apple"), call("lookup", item="pear"))
    if request.turn == 2:
        if ask == "greedy":
            return calls(
                call("buy", item="apple", qty="two"),
                call("buy", item="apple", qty=2),
                call("buy", item="pear", qty=1),
            )
        return calls(call("buy", item="apple", qty=2))
    return answer("Bought 2 apples at $3.")


def bought(history: Any) -> str | None:
    """The shop's "done": something was bought (a refused buy bought nothing)."""
    return None if any(r.ok and r.name == "buy" for r in history) else "nothing was bought"


agent = durable.CodeWorkflow(
    "crash_agent",
    version=1,
    toolbox=shop,
    model=ScriptedModel("scripted-shopper", shopping_plan),
    on_failure="tell",
    done=bought,
)


@agent.run
def shop_for_apples(ctx: durable.AgentContext) -> str:
    messages = [system_message("You buy fruit."), user_message(ctx.input.get("ask", "apples"))]
    while not (turn := ctx.llm(messages)).is_final:
        messages.append(turn.message)
        for tool_call in turn.tool_calls:
            messages.append(tool_result_message(tool_call.id, ctx.tool(tool_call).result))
        bought = any(r.name == "buy" for r in ctx.history)
        if bought and (
            ctx.input.get("fail_after_buy") or (ctx.input.get("fail_if_forked") and ctx.branch)
        ):
            raise durable.PermanentStepError("the shop closed")
    return turn.text


agent.compensation("tell")(effect)


# --- agent mode: a buy whose answer is lost, and a reconcile that asks the partner -------------
#: The shopping agent whose buy is applied and then, on the first attempt, its answer lost: it
#: backs off while the partner has the money. Its reconcile asks the partner under the key.
careful_shop = Toolbox("crash_careful_agent")
careful_shop.tool("lookup", read_only=True, description="The price of an item, in dollars.")(lookup)


def find_purchase(ctx: ToolContext, item: str, qty: int) -> dict[str, Any] | None:
    """Reconcile for a buy: the partner's effect under the call's key, or None (its ledger
    is consistent, so none proves the buy did not happen)."""
    if partner.effects()[ctx.idempotency_key]:
        return {"item": item, "qty": qty, "key": ctx.idempotency_key, "replayed": True}
    return None


@careful_shop.tool(
    "buy", side_effect=True, compensate="refund", reconcile=find_purchase, description="Buy."
)
def buy_answer_lost(ctx: ToolContext, item: str, qty: int) -> dict[str, Any]:
    _record_tool(ctx)
    applied = partner.apply(ctx.idempotency_key)
    if ctx.attempt == 1:
        raise durable.RetryableStepError("read timed out after the request was sent")
    return {"item": item, "qty": qty, **applied}


careful_shop.compensation("refund")(refund_purchase)
careful_agent = durable.CodeWorkflow(
    "crash_careful_agent",
    version=1,
    toolbox=careful_shop,
    model=ScriptedModel("scripted-shopper", shopping_plan),
    on_failure="tell",
)
careful_agent.run(shop_for_apples)
careful_agent.compensation("tell")(effect)


def effect_then_lose_the_database(ctx: durable.StepContext) -> dict[str, Any]:
    """Makes its effect, then its process's database session is ended (as a server restart
    or a failover would end it) before the result is recorded."""
    import psycopg
    from django.db import connection

    result = effect(ctx)
    backend = connection.connection.info.backend_pid
    settings = connection.settings_dict
    with psycopg.connect(
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
        dbname=settings["NAME"],
        user=settings["USER"] or None,
        autocommit=True,
    ) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [backend])
    return result


lost_db = durable.Workflow("crash_lost_db", version=1)
lost_db.step("charge", kind="effect")(effect_then_lose_the_database)
lost_db.step("finish", kind="read")(_finish)


# --- a pooler loses a prepared statement (issue 20) ---------------------------------------------
def _lose_a_prepared_statement() -> None:
    """What PgBouncer in transaction mode does to a client: the server connection it is handed
    has no such prepared statement. A real error from Postgres (SQLSTATE 26000)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXECUTE agentflow_lost_by_the_pooler")


def read_losing_a_statement(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    if ctx.attempt == 1:
        _lose_a_prepared_statement()
    return {"step": ctx.step, "seq": ctx.seq}


def effect_losing_a_statement(ctx: durable.StepContext) -> dict[str, Any]:
    """The effect is made, then the database fails: it may have happened, and the retry under
    the same key replays it rather than making a second one."""
    _record(ctx)
    result = partner.apply(ctx.idempotency_key)
    if ctx.attempt == 1:
        _lose_a_prepared_statement()
    return result


def effect_always_losing_a_statement(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    result = partner.apply(ctx.idempotency_key)
    _lose_a_prepared_statement()
    return result


QUICK = durable.RetryPolicy(base_seconds=0.01, max_seconds=0.02, max_attempts=3)
pooled = durable.Workflow("crash_pooled", version=1)
pooled.step("lookup", kind="read", retry=QUICK)(read_losing_a_statement)
pooled.step("charge", kind="effect", retry=QUICK)(effect_losing_a_statement)
pooled.step("finish", kind="read")(_finish)


def read_always_losing_a_statement(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    _lose_a_prepared_statement()
    return {}


pooled_for_good = durable.Workflow("crash_pooled_for_good", version=1)
pooled_for_good.step("charge", kind="effect", retry=QUICK)(effect_always_losing_a_statement)

pooled_read_for_good = durable.Workflow("crash_pooled_read_for_good", version=1)
pooled_read_for_good.step("lookup", kind="read", retry=QUICK)(read_always_losing_a_statement)

# --- agent mode: a divergence an operator answers with a fork ---------------------------------
#: The shopping agent again, but its buy holds until the test releases it, and a prompt
#: "deployed" mid-run (a flag at the partner) changes the conversation from the second turn on:
#: the next task's replay finds turn 2 recorded with other messages and parks the run.
drifting_shop = Toolbox("crash_drift_agent")
drifting_shop.tool("lookup", read_only=True, description="The price of an item, in dollars.")(
    lookup
)


@drifting_shop.tool("buy", side_effect=True, description="Buy an item.")
def held_buy(ctx: ToolContext, item: str, qty: int) -> dict[str, Any]:
    _record_tool(ctx)
    partner.wait_for_release(f"{ctx.run_id}/buy")
    return {"item": item, "qty": qty, **partner.apply(ctx.idempotency_key)}


drift_agent = durable.CodeWorkflow(
    "crash_drift_agent",
    version=1,
    toolbox=drifting_shop,
    model=ScriptedModel("scripted-shopper", shopping_plan),
)
PRICES_NOTE = "Prices may have changed since you looked them up."


def prompt_changed(run_id: str) -> str:
    """The partner flag a test sets to change the run's prompt under it."""
    return f"{run_id}/prompt-v2"


@drift_agent.run
def shop_with_a_changing_prompt(ctx: durable.AgentContext) -> str:
    messages = [system_message("You buy fruit."), user_message("apples")]
    while not (turn := ctx.llm(messages)).is_final:
        messages.append(turn.message)
        for tool_call in turn.tool_calls:
            messages.append(tool_result_message(tool_call.id, ctx.tool(tool_call).result))
        if partner.is_released(prompt_changed(ctx.run_id)):
            messages.append(user_message(PRICES_NOTE))
    return turn.text


#: An effect, then a db step: a worker that loaded the db step before a cancel writes nothing.
noted = durable.Workflow("crash_noted", version=1, on_failure="notify")
noted.step("book", kind="effect", compensate="unbook")(effect)
noted.step("note", kind="db")(read)
noted.step("finish", kind="read")(_finish)
noted.compensation("unbook")(effect)
noted.compensation("notify")(effect)

#: An agent function that changes its mind on replay (the partner flag `<run>/moody` set) and
#: raises before the effect whose attempt is already recorded at the next position.
moody = durable.CodeWorkflow("crash_moody", version=1)


@moody.run
def charge_unless_moody(ctx: durable.AgentContext) -> str:
    ctx.step("prepare", read)
    if partner.is_released(f"{ctx.run_id}/moody"):
        raise RuntimeError("the function changed its mind")
    ctx.step("charge", effect, kind="effect")
    return "charged"


# --- durable time and people (docs/workflows.md, "Timers, signals and approvals") -----------------
def _over_limit(ctx: durable.StepContext) -> bool:
    return int(ctx.input.get("amount", 0)) > 1000


def _after_decision(output: Any) -> str:
    return "declined" if isinstance(output, dict) and output.get("approved") is False else "finish"


def _charge_approved(ctx: durable.StepContext) -> dict[str, Any]:
    assert ctx.decision is None or ctx.decision.approved
    return {**effect(ctx), "approved_by": ctx.decision.actor if ctx.decision else None}


#: prepare -> charge (an effect; amounts over 1000 wait for approval) -> finish, or declined.
approval = durable.Workflow("hitl_approval", version=1)
approval.step("prepare", kind="read")(read)
approval.step(
    "charge",
    kind="effect",
    requires_approval=_over_limit,
    approval_arguments=lambda ctx: {"amount": ctx.input.get("amount")},
    next=_after_decision,
)(_charge_approved)
approval.step("finish", kind="read", next=lambda output: durable.END)(_finish)
approval.step("declined", kind="read")(read)


#: prepare -> wait for signal "reply" (timeout from the input) -> finish.
signalled = durable.Workflow("hitl_signal", version=1)
signalled.step("prepare", kind="read")(read)
signalled.wait_for("reply", signal="reply", timeout=None)
signalled.step("finish", kind="read")(_finish)

#: prepare -> wait for "reply" at most 60 s -> finish (its output says which).
signal_or_timeout = durable.Workflow("hitl_signal_timeout", version=1)
signal_or_timeout.step("prepare", kind="read")(read)
signal_or_timeout.wait_for("reply", signal="reply", timeout=60)
signal_or_timeout.step("finish", kind="read")(_finish)


def _replies(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    return {"first": ctx.output_of("first"), "second": ctx.output_of("second")}


#: prepare (held until the test releases it, so signals can be sent before the run gets to its
#: waits) -> wait for "reply" -> wait for "reply" again -> finish with what each one took.
two_replies = durable.Workflow("hitl_two_replies", version=1)
two_replies.step("prepare", kind="read")(held_read)
two_replies.wait_for("first", signal="reply", timeout=None)
two_replies.wait_for("second", signal="reply", timeout=None)
two_replies.step("finish", kind="read")(_replies)

#: prepare -> wait for "reply" at most 60 s -> wait for "reply" again, without a timeout.
late_reply = durable.Workflow("hitl_late_reply", version=1)
late_reply.step("prepare", kind="read")(read)
late_reply.wait_for("first", signal="reply", timeout=60)
late_reply.wait_for("second", signal="reply", timeout=None)
late_reply.step("finish", kind="read")(_replies)


#: prepare -> sleep 120 s -> finish.
timed = durable.Workflow("hitl_timer", version=1)
timed.step("prepare", kind="read")(read)
timed.sleep("cool_off", seconds=120)
timed.step("finish", kind="read")(_finish)


# --- agent mode: durable time and people ---------------------------------------------------------
cashier_tools = Toolbox("hitl_cashier")
DISCOUNT_NOTE = "The customer has a discount."


@cashier_tools.tool(
    "charge",
    side_effect=True,
    compensate="refund_charge",
    description="Charge the customer, in cents.",
    requires_approval=lambda arguments: arguments["amount_cents"] > 1000,
    max_calls=2,  # a fork's branch may charge another amount (the limit counts every branch)
)
def charge_tool(ctx: ToolContext, amount_cents: int) -> dict[str, Any]:
    _record_tool(ctx)
    return {"amount_cents": amount_cents, **partner.apply(ctx.idempotency_key)}


@cashier_tools.compensation("refund_charge")
def refund_charge(ctx: ToolContext) -> dict[str, Any]:
    _record_tool(ctx)
    return partner.apply(ctx.idempotency_key)


def cashier_plan(request: ModelRequest) -> Any:
    """Turn 1: charge 4500 (3000 once the discount note is in the conversation); then say
    what the tool answered."""
    if request.turn == 1:
        said = [m.get("content") for m in request.messages if m.get("role") == "user"]
        amount = 3000 if DISCOUNT_NOTE in said else int(said[0] or 4500)
        return calls(call("charge", amount_cents=amount))
    result = next(m["content"] for m in reversed(request.messages) if m.get("role") == "tool")
    return answer(f"charge answered: {result}")


cashier = durable.CodeWorkflow(
    "hitl_cashier",
    version=1,
    toolbox=cashier_tools,
    model=ScriptedModel("scripted-cashier", cashier_plan),
)


def discount(run_id: str) -> str:
    """The partner flag that gives the customer a discount (a fork sees another conversation)."""
    return f"{run_id}/discount"


@cashier.run
def charge_the_customer(ctx: durable.AgentContext) -> str:
    messages = [system_message("You charge fees."), user_message(str(ctx.input.get("amount", "")))]
    if partner.is_released(discount(ctx.run_id)):
        messages.append(user_message(DISCOUNT_NOTE))
    while not (turn := ctx.llm(messages)).is_final:
        messages.append(turn.message)
        for tool_call in turn.tool_calls:
            messages.append(tool_result_message(tool_call.id, ctx.tool(tool_call).result))
    return turn.text


#: prepare, sleep 60 s, wait for signal "reply" (timeout from the input), then record it.
waiting_agent = durable.CodeWorkflow("hitl_patient", version=1)


@waiting_agent.run
def wait_patiently(ctx: durable.AgentContext) -> dict[str, Any]:
    ctx.step("prepare", read)
    ctx.sleep(ctx.input.get("sleep", 60))
    got = ctx.wait_for("reply", timeout=ctx.input.get("timeout"))
    heard = {"payload": got.payload, "timed_out": got.timed_out}
    ctx.step("finish", read, arguments=heard)
    return heard


#: waits for signal "reply" twice, then records both payloads in the order it took them.
two_replies_agent = durable.CodeWorkflow("hitl_two_replies_agent", version=1)


@two_replies_agent.run
def hear_twice(ctx: durable.AgentContext) -> dict[str, Any]:
    ctx.step("prepare", held_read)
    heard = [ctx.wait_for("reply").payload, ctx.wait_for("reply").payload]
    ctx.step("finish", read, arguments={"heard": heard})
    return {"heard": heard}


#: prepare -> sleep 3 s -> finish: short enough for a test with real workers to wait out.
short_timer = durable.Workflow("hitl_short_timer", version=1)
short_timer.step("prepare", kind="read")(read)
short_timer.sleep("pause", seconds=3)
short_timer.step("finish", kind="read")(_finish)


# --- agent mode: a long conversation, recorded before per-turn deltas ----------------------------
#: Twenty model turns, a read-only tool call in each of the first nineteen. A run of it recorded
#: with the whole conversation in every turn's checkpoint (before per-turn deltas) is kept under
#: tests/agentflow/integration/fixtures: the engine must still replay it.
counting = Toolbox("long_agent")
#: The turn of every request the counting planner answered, in this process.
counting_requests: list[int] = []


@counting.tool("count", read_only=True, description="The square of a number.")
def count(ctx: ToolContext, n: int) -> dict[str, Any]:
    _record_tool(ctx)
    return {"n": n, "square": n * n}


def counting_plan(request: ModelRequest) -> Any:
    counting_requests.append(request.turn)
    if request.turn < 20:
        return calls(call("count", n=request.turn))
    return answer("Counted to 19.")


long_agent = durable.CodeWorkflow(
    "long_agent",
    version=1,
    toolbox=counting,
    model=ScriptedModel("scripted-counter", counting_plan),
)


@long_agent.run
def count_along(ctx: durable.AgentContext) -> str:
    messages = [system_message("You count."), user_message("Square 1 to 19, one at a time.")]
    while not (turn := ctx.llm(messages)).is_final:
        messages.append(turn.message)
        for tool_call in turn.tool_calls:
            messages.append(tool_result_message(tool_call.id, ctx.tool(tool_call).result))
    return turn.text


#: The counting agent, but once the partner flag `<run>/edit` is set its function edits the
#: user's message in place after each turn: the later requests then differ from the recorded
#: ones although each holds the very message objects sent before.
editing_agent = durable.CodeWorkflow(
    "editing_agent",
    version=1,
    toolbox=counting,
    model=ScriptedModel("scripted-counter", counting_plan),
)


@editing_agent.run
def count_and_edit(ctx: durable.AgentContext) -> str:
    messages = [system_message("You count."), user_message("Square 1 to 19, one at a time.")]
    while not (turn := ctx.llm(messages)).is_final:
        messages.append(turn.message)
        for tool_call in turn.tool_calls:
            messages.append(tool_result_message(tool_call.id, ctx.tool(tool_call).result))
        if partner.is_released(f"{ctx.run_id}/edit"):
            messages[1]["content"] = "Square 1 to 19, twice."
    return turn.text


def _over_limit_unless_broken(ctx: durable.StepContext) -> bool:
    """`requires_approval`'s predicate, which raises once the test breaks it (its own data
    store gone, say): the engine must not take that for the step's own failure."""
    broken = partner.is_released(f"{ctx.run_id}/predicate-broken")
    if broken and not partner.is_released(f"{ctx.run_id}/predicate-fixed"):
        raise RuntimeError("the predicate's lookup failed")
    return _over_limit(ctx)


#: prepare -> charge (an effect with a compensation; over 1000 waits for approval) -> finish.
approved_refundable = durable.Workflow("hitl_approved_refundable", version=1)
approved_refundable.step("prepare", kind="read")(read)
approved_refundable.step(
    "charge",
    kind="effect",
    compensate="refund",
    requires_approval=_over_limit_unless_broken,
    approval_arguments=lambda ctx: {"amount": ctx.input.get("amount")},
)(_charge_approved)
approved_refundable.step("finish", kind="read")(_finish)
approved_refundable.compensation("refund")(effect)


# --- sensitive arguments and what a decision tells the customer (issue 30) ----------------------
#: Whoever holds this permission (besides deciders) may read the confided notes below.
CONFIDED_READERS = "auth.view_user"
REPLIES = durable.Replies(
    approve=["Approved: nothing to pay.", "Approved, and we're sorry."],
    reject=["We couldn't approve it.", "We couldn't approve it without documents."],
)


def _confided_next(output: Any) -> str:
    return "declined" if isinstance(output, dict) and output.get("approved") is False else "file"


def _file_the_note(ctx: durable.StepContext) -> dict[str, Any]:
    """Files the customer's note; with `fail` in the input it fails quoting it (an error a
    partner might write), so the note reaches the error, the events and the timeline."""
    _record(ctx)
    if ctx.input.get("fail"):
        raise durable.PermanentStepError(f"the registry refused the note: {ctx.input['note']}")
    return {"filed": True}


#: prepare -> consider (waits for approval of the amount and the customer's confided note,
#: which only deciders and CONFIDED_READERS read) -> file, or declined.
confided = durable.Workflow("privacy_confided", version=1)
confided.step("prepare", kind="read")(read)
confided.step(
    "consider",
    kind="read",
    requires_approval=True,
    approval_arguments=lambda ctx: {"amount": ctx.input.get("amount"), "note": ctx.input["note"]},
    sensitive=durable.Sensitive("note", readers=[CONFIDED_READERS]),
    replies=REPLIES,
    next=_confided_next,
)(lambda ctx: {"approved": True, "reply": ctx.decision.reply if ctx.decision else ""})
confided.step("file", kind="read", next=lambda output: durable.END)(_file_the_note)
confided.step("declined", kind="read")(read)


confiding_tools = Toolbox("privacy_confiding")


@confiding_tools.tool(
    "file_claim",
    side_effect=True,
    description="File the customer's claim with their note.",
    requires_approval=True,
    # What the operator reads besides the model's call: the customer's story, from the run's
    # input (the model never sees it).
    approval_arguments=lambda ctx, arguments: {"story": ctx.input.get("story", "")},
    sensitive=durable.Sensitive("note", "story", readers=[CONFIDED_READERS]),
    replies=REPLIES,
)
def file_claim(ctx: ToolContext, claim: str, note: str) -> dict[str, Any]:
    _record_tool(ctx)
    reply = ctx.decision.reply if ctx.decision else ""
    return {"claim": claim, "reply": reply, **partner.apply(ctx.idempotency_key)}


def confiding_plan(request: ModelRequest) -> Any:
    """Turn 1: file the claim with the user's note; then say what the tool answered."""
    if request.turn == 1:
        note = next(m["content"] for m in request.messages if m.get("role") == "user")
        return calls(call("file_claim", claim="c-1", note=note))
    result = next(m["content"] for m in reversed(request.messages) if m.get("role") == "tool")
    return answer(f"file_claim answered: {result}")


confiding = durable.CodeWorkflow(
    "privacy_confiding",
    version=1,
    toolbox=confiding_tools,
    model=ScriptedModel("scripted-claims", confiding_plan),
)


@confiding.run
def file_the_claim(ctx: durable.AgentContext) -> str:
    """Files the claim; with `fail` in the input the run then fails (so it may be forked)."""
    messages = [system_message("You file claims."), user_message(ctx.input["note"])]
    while not (turn := ctx.llm(messages)).is_final:
        messages.append(turn.message)
        for tool_call in turn.tool_calls:
            messages.append(tool_result_message(tool_call.id, ctx.tool(tool_call).result))
    if ctx.input.get("fail"):
        raise durable.PermanentStepError("the registry closed")
    return turn.text


# --- builds (docs/deploys.md, "Builds") -----------------------------------------------------------
#: Declared pinned: every run finishes on the build it started on.
pinned = durable.Workflow("build_pinned", version=1, versioning="pinned")
pinned.step("prepare", kind="read")(read)
pinned.step("charge", kind="effect")(effect)
pinned.step("finish", kind="read")(_finish)

#: A run that waits for a signal between two steps: moved to a build, then rolled back under.
rollback = durable.Workflow("build_rollback", version=1)
rollback.step("prepare", kind="read")(read)
rollback.wait_for("reply", signal="reply", timeout=None)
rollback.step("charge", kind="effect")(effect)
rollback.step("finish", kind="read")(_finish)

#: Books, then fails for good: its compensation blocks until the test releases the run, so a
#: deploy can come in the middle of undoing.
undo_held = durable.Workflow("build_undo_held", version=1, on_failure="notify")
undo_held.step("book", kind="effect", compensate="unbook")(effect)
undo_held.step("confirm", kind="effect")(declined_effect)
undo_held.compensation("unbook")(held_effect)
undo_held.compensation("notify")(effect)


# --- partner limits (docs/partner-limits.md, "What happens"): partner_call ----------------


def _acme_call(ctx: durable.StepContext, operation: str) -> dict[str, Any]:
    """One request to partner `acme`: its turn, then the answer the test scripted."""
    with durable.partner_call("acme", operation):
        answer = partner.next_answer()
        if answer == "429":
            raise durable.PartnerRateLimited("acme answered 429", retry_after_seconds=0.5)
        if answer == "503":
            raise durable.PartnerUnavailable("acme answered 503")
        return partner.apply(ctx.idempotency_key)


def limited_read(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    with durable.partner_call("acme", "lookup"):
        partner.next_answer()
    return {"looked_up": True}


def limited_effect(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    return _acme_call(ctx, "charge")


limited = durable.Workflow("limited", version=1)
limited.step("look_up", kind="read")(limited_read)
limited.step("charge", kind="effect", retry=durable.RetryPolicy(max_attempts=3, base_seconds=0.05))(
    limited_effect
)
limited.step("finish", kind="read")(_finish)


def place_holder(ctx: durable.StepContext) -> dict[str, Any]:
    """Takes acme's place in flight and holds it until the test releases the run, makes its
    effect, and dies there when aimed (`hold_place:in_partner_call`): SIGKILLed between taking
    its place and giving it back."""
    with durable.partner_call("acme", "hold"):
        _record(ctx)  # recorded once its place is taken
        partner.wait_for_release(ctx.run_id)
        done = partner.apply(ctx.idempotency_key)
        faults.crash_point(ctx.step, "in_partner_call", ctx.attempt)
    return done


def next_in_line(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    return _acme_call(ctx, "call")


#: One limited call holding its place (concurrency 1), and one waiting for that place.
held_place = durable.Workflow("held_place", version=1)
held_place.step("hold_place", kind="effect")(place_holder)
waits_for_place = durable.Workflow("waits_for_place", version=1)
waits_for_place.step("after_place", kind="effect")(next_in_line)


# --- names an operator reads, with any character a real system uses (issue 37) ------------------
#: A partner key (a model's name), a workflow, its steps and the signal it waits for, named with
#: "/", ":", ".", spaces and non-ASCII letters.
ODD_PARTNER = "openai/gpt-4o-mini"
ODD_SIGNAL = "bank/ü: settled.v2"


def odd_partner_call(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    with durable.partner_call(ODD_PARTNER, "ask"):
        return {"asked": ODD_PARTNER}


odd_names = durable.Workflow("billing/eu:refunds ü", version=1)
odd_names.step("charge card/eu: ü", kind="read")(odd_partner_call)
odd_names.wait_for("await the bank: 東京", signal=ODD_SIGNAL, timeout=None)
odd_names.step("done.ok", kind="read")(_finish)


#: What a schedule starts in the schedules' acceptance tests (tests/agentflow/acceptance/
#: test_schedules.py): one read, counted at the partner stand-in, with the slot it was given.
def _scheduled(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    return {"scheduled_at": ctx.input["scheduled_at"]}


schedule_probe = durable.Workflow("schedule_probe", version=1)
schedule_probe.step("slot", kind="read")(_scheduled)


# --- runs that start runs --------------------------------------------------------------------
def kid_work(ctx: durable.StepContext) -> dict[str, Any]:
    """A child's one effect; a child whose input says so fails for good after it."""
    _record(ctx)
    done = partner.apply(ctx.idempotency_key)
    if ctx.input.get("fail"):
        raise durable.PermanentStepError(f"child {ctx.input['i']} was told to fail")
    return done


def kid_undo(ctx: durable.StepContext) -> dict[str, Any]:
    _record(ctx)
    return partner.apply(ctx.idempotency_key)


#: A child: one effect (undone by `undo_work` if the child is cancelled or fails after it),
#: then a read. `input["hold"]`: the read blocks until the test releases the child.
kid = durable.Workflow("family_child", version=1)
kid.step("work", kind="effect", compensate="undo_work")(kid_work)
kid.step("after", kind="read")(read)
kid.compensation("undo_work")(kid_undo)

#: A held child: it blocks in `hold` until the test releases it.
held_kid = durable.Workflow("family_held_child", version=1)
held_kid.step("work", kind="effect", compensate="undo_work")(kid_work)
held_kid.step("hold", kind="read")(held_read)
held_kid.compensation("undo_work")(kid_undo)


def start_kids(ctx: durable.StepContext) -> dict[str, Any]:
    """`input["n"]` children (`input["fail"]`: the indexes told to fail; `input["held"]`: the
    indexes that block until released)."""
    _record(ctx)
    failing, held_ones = set(ctx.input.get("fail", ())), set(ctx.input.get("held", ()))
    children = [
        (
            held_kid.name if i in held_ones else kid.name,
            {"i": i, "fail": i in failing},
            None,
        )
        for i in range(ctx.input["n"])
    ]
    return {"children": durable.start_children(ctx, children)}


def started_kids(ctx: durable.StepContext) -> dict[str, Any] | None:
    found = durable.started_children(ctx)
    return {"children": found} if found else None


#: start N children -> wait for all -> read; cancelled or failed, it cancels its children.
family = durable.Workflow("family_parent", version=1)
family.step("start_kids", kind="effect", reconcile=started_kids, compensate="cancel_kids")(
    start_kids
)
durable.wait_for_children(family, "wait_kids", wait="all")
family.step("finish", kind="read")(_finish)
family.compensation("cancel_kids")(durable.cancel_children)

#: The same, waiting for the first child only, and leaving the others when it stops.
first_of = durable.Workflow("family_first", version=1)
first_of.step("start_kids", kind="effect", reconcile=started_kids)(start_kids)
durable.wait_for_children(first_of, "wait_kids", wait="first")
first_of.step("finish", kind="read")(_finish)


#: The family in agent mode: its function starts N children (`fail` as above), waits for all
#: of them, and returns their ids with the counts.
family_agent = durable.CodeWorkflow("family_agent_parent", version=1)


@family_agent.run
def raise_family(ctx: durable.AgentContext) -> dict[str, Any]:
    failing = set(ctx.input.get("fail", ()))
    ids = durable.start_children(
        ctx,
        [(kid.name, {"i": i, "fail": i in failing}, None) for i in range(ctx.input["n"])],
        compensate=None,  # stopped, it leaves them to finish
    )
    report = durable.wait_for_children(ctx, wait="all")
    return {"children": ids, "counts": report["counts"], "ended": len(report["children"])}


#: Children that wait for the signal `go` (WAITING, holding no worker): a charged one after
#: its effect, a gated one before it. What a parent's cancel or failure finds them doing.
charged_kid = durable.Workflow("fate_charged_child", version=1)
charged_kid.step("work", kind="effect", compensate="undo_work")(kid_work)
charged_kid.wait_for("go", signal="go")
charged_kid.step("after", kind="read")(read)
charged_kid.compensation("undo_work")(kid_undo)

gated_kid = durable.Workflow("fate_gated_child", version=1)
gated_kid.wait_for("go", signal="go")
gated_kid.step("work", kind="effect", compensate="undo_work")(kid_work)
gated_kid.step("after", kind="read")(read)
gated_kid.compensation("undo_work")(kid_undo)

#: What `input["fate"]` has the fated parent pass as `compensate=` ("unsaid": nothing).
FATES: dict[str, str | None] = {"cancel": "cancel_kids", "leave": None, "unknown": "no_such"}


def give_up(ctx: durable.StepContext) -> None:
    _record(ctx)
    raise durable.PermanentStepError("the parent gave up")


#: An agent parent that says its children's fate (`input["fate"]`, see FATES): it starts
#: `input["charged"]` charged children then `input["gated"]` gated ones at position 1, and
#: waits for them all. `input["fail"]`: before its wait, it waits for the signal `go`, then
#: fails for good (a later call that raises).
fated_agent = durable.CodeWorkflow("family_agent_fated", version=1)


@fated_agent.run
def raise_fated_family(ctx: durable.AgentContext) -> dict[str, Any]:
    charged, gated = ctx.input.get("charged", 0), ctx.input.get("gated", 0)
    kids = [(charged_kid.name, {"i": i}, None) for i in range(charged)]
    kids += [(gated_kid.name, {"i": charged + i}, None) for i in range(gated)]
    fate = ctx.input["fate"]
    said = {} if fate == "unsaid" else {"compensate": FATES[fate]}
    ids = durable.start_children(ctx, kids, **said)  # type: ignore[arg-type]
    if ctx.input.get("fail"):
        ctx.wait_for("go")
        ctx.step("give_up", give_up)
    report = durable.wait_for_children(ctx, wait="all")
    return {"children": ids, "counts": report["counts"]}


fated_agent.compensation("cancel_kids")(durable.cancel_children)


# --- priorities and concurrency keys (docs/workflows.md) ----------------------------------------
#: One read step: a backlog of these is what a run of higher priority must pass.
one_read = durable.Workflow("queue_one_read", version=1)
one_read.step("only", kind="read")(read)


def _key(input: dict[str, Any]) -> str:
    return str(input["key"])


#: One run per key at a time; `hold` blocks until the test releases the run.
keyed = durable.Workflow("queue_keyed", version=1, concurrency_key=_key, concurrency_limit=1)
keyed.step("hold", kind="read")(held_read)
keyed.step("finish", kind="read")(_finish)

#: One run per key at a time, one quick step: many keys' runs taking turns.
keyed_quick = durable.Workflow("queue_keyed_quick", version=1, concurrency_key=_key)
keyed_quick.step("only", kind="read")(read)
