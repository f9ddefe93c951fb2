"""agentflow.testing, as a host project's tests use it: runs driven to their end in this process
without a broker, crashes at named points, the effects check, and a real worker from the
pytest plugin's fixture. Real Postgres throughout; the partner is the SQLite stand-in, which
counts every request and each effect once per key, apart from the engine's rows."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

from agentflow import durable, testing
from agentflow._base.states import RunStatus, StepStatus
from agentflow._core import faults
from agentflow._engine import runtime
from agentflow.testing.processes import RedisServer, WorkerProcess
from tests.support import partner, workflows

ROOT = Path(__file__).resolve().parents[3]


def effects(key: str) -> int:
    return partner.effects().get(key, 0)


def requests(key: str) -> int:
    return partner.requests().get(key, 0)


# --- run_to_end without a broker ----------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.usefixtures("partner_db")
def test_run_to_end__in_the_tests_transaction__completes_with_no_broker_at_all() -> None:
    """No `engine`/`broker` fixture: nothing here can reach a broker, and none is needed."""
    run_id = durable.start(workflows.chain.name, input={"order": 7})

    run = testing.run_to_end(run_id)

    assert run.status == RunStatus.COMPLETED, run.error
    assert [(s.name, s.status) for s in run.steps] == [
        ("prepare", StepStatus.COMPLETED),
        ("charge", StepStatus.COMPLETED),
        ("finish", StepStatus.COMPLETED),
    ]
    assert testing.assert_effects_once(run_id, partner=effects) == {
        durable.idempotency_key(run_id, 2): 1
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("partner_db")
def test_run_to_end__committed_runs__the_published_messages_are_kept_in_the_outbox(
    agentflow_outbox: testing.Outbox,
) -> None:
    run_id = durable.start(workflows.chain.name)  # commits: step 1 is "published" at once

    run = testing.run_to_end(run_id)

    assert run.status == RunStatus.COMPLETED, run.error
    assert [(m.run_id, m.seq) for m in agentflow_outbox.for_run(run_id)] == [
        (run_id, 1),
        (run_id, 2),
        (run_id, 3),
    ]


@pytest.mark.django_db
@pytest.mark.usefixtures("partner_db")
def test_run_to_end__an_hour_long_back_off_is_waited_out_by_the_database_clock() -> None:
    run_id = durable.start(workflows.dormant.name)

    waiting = testing.run_to_end(run_id, retries=False)
    assert waiting.status == RunStatus.WAITING
    assert [s.attempts for s in waiting.steps] == [1]

    run = testing.run_to_end(run_id)
    assert run.status == RunStatus.COMPLETED, run.error
    assert run.steps[0].attempts == 2
    key = durable.idempotency_key(run_id, 1)
    assert (requests(key), effects(key)) == (1, 1)  # the first attempt failed before calling


@pytest.mark.django_db
@pytest.mark.usefixtures("partner_db")
def test_run_to_end__a_permanent_failure__ends_failed_and_its_effect_did_not_happen() -> None:
    run_id = durable.start(workflows.declined.name)

    run = testing.run_to_end(run_id)

    assert run.status == RunStatus.FAILED
    assert testing.assert_effects_once(run_id, partner=effects) == {
        durable.idempotency_key(run_id, 2): 0
    }


@pytest.mark.django_db
def test_run_to_end__unknown_run__says_so() -> None:
    with pytest.raises(LookupError, match="no workflow run"):
        testing.run_to_end("wf_missing")


# --- crash_at ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "database",
    [
        pytest.param("db", marks=pytest.mark.django_db),
        pytest.param("transactional_db", marks=pytest.mark.django_db(transaction=True)),
    ],
)
@pytest.mark.parametrize("point", faults.CRASH_POINTS)
@pytest.mark.usefixtures("partner_db")
def test_crash_at__every_point_of_the_effect__recovers_and_the_effect_happens_once(
    point: str, database: str
) -> None:
    run_id = durable.start(workflows.chain.name)

    with testing.crash_at(f"charge:{point}") as crash:
        run = testing.run_to_end(run_id)

    assert crash.fired
    assert run.status == RunStatus.COMPLETED, run.error
    key = durable.idempotency_key(run_id, 2)
    assert testing.assert_effects_once(run_id, partner=effects) == {key: 1}
    charge = run.steps[1]
    if point == "after_complete":
        assert (charge.attempts, requests(key)) == (1, 1)  # done before the crash
    elif point == "after_effect":
        assert (charge.attempts, requests(key)) == (2, 2)  # asked again under the same key
    else:
        assert (charge.attempts, requests(key)) == (2, 1)  # died before calling


@pytest.mark.django_db
@pytest.mark.usefixtures("partner_db")
def test_crash_at__a_read_step_after_its_work__runs_it_again() -> None:
    run_id = durable.start(workflows.chain.name)

    with testing.crash_at("prepare:after_effect"):
        run = testing.run_to_end(run_id)

    assert run.status == RunStatus.COMPLETED, run.error
    assert partner.execution_counts(run_id)[(run_id, 1, "prepare")] == 2


@pytest.mark.django_db
@pytest.mark.usefixtures("partner_db")
def test_crash_at__without_recovery__the_crash_is_raised_and_the_check_sees_the_claim() -> None:
    run_id = durable.start(workflows.chain.name)
    runtime.run_step(run_id, 1)

    with testing.crash_at("charge:after_effect"), pytest.raises(testing.SimulatedCrash):
        runtime.run_step(run_id, 2)

    with pytest.raises(AssertionError, match=r"charge .* still IN_PROGRESS"):
        testing.assert_effects_once(run_id)
    # The dead worker's claim is taken over by the next delivery, which asks again.
    run = testing.run_to_end(run_id)
    assert run.status == RunStatus.COMPLETED
    testing.assert_effects_once(run_id, partner=effects)


@pytest.mark.django_db
@pytest.mark.usefixtures("partner_db")
def test_crash_at__a_step_that_is_never_reached__fails_the_block() -> None:
    run_id = durable.start(workflows.chain.name)

    with pytest.raises(AssertionError, match="never fired"), testing.crash_at("chrage:after_claim"):
        testing.run_to_end(run_id)


@pytest.mark.parametrize("where", ["charge", "charge:before_effect", ":after_claim", ""])
def test_crash_at__a_point_that_cannot_fire__is_refused(where: str) -> None:
    with pytest.raises(ValueError):
        testing.crash_env(where)
    with pytest.raises(ValueError), testing.crash_at(where):
        pass


def test_crash_env__is_what_a_worker_reads() -> None:
    assert testing.crash_env("charge:after_effect") == {
        "AGENTFLOW_FAULTS": "1",
        "AGENTFLOW_CRASH_AT": "charge:after_effect",
    }


# --- assert_effects_once -------------------------------------------------------------------------
@pytest.mark.django_db
@pytest.mark.usefixtures("partner_db")
def test_assert_effects_once__a_partner_that_counts_otherwise__fails_with_the_key() -> None:
    run_id = durable.start(workflows.chain.name)
    testing.run_to_end(run_id)
    key = durable.idempotency_key(run_id, 2)

    with pytest.raises(
        AssertionError, match=rf"charge \(effect\) completed under key {key}.* 2 times"
    ):
        testing.assert_effects_once(run_id, partner=lambda _key: 2)
    with pytest.raises(AssertionError, match="0 times"):
        testing.assert_effects_once(run_id, partner=lambda _key: 0)


# --- the plugin's real worker ------------------------------------------------------------------
@pytest.mark.usefixtures("partner_db")
def test_agentflow_worker__a_real_worker_killed_after_the_effect__completes_it_once(
    agentflow_worker: Callable[..., WorkerProcess],
    broker: RedisServer,
    partner_db: Path,
) -> None:
    worker = agentflow_worker(
        env={
            **testing.crash_env("charge:after_effect"),
            "AGENTFLOW_WORKFLOW_MODULES": "tests.support.workflows",
            "TEST_PARTNER_DB": str(partner_db),
        },
        settings={"CELERY_BROKER_URL": broker.url},
    )
    child = worker.children()[0]

    run_id = durable.start(workflows.chain.name)  # published to the worker's broker

    run = testing.wait_for_run(run_id, timeout=60, worker=worker)
    assert run.status == RunStatus.COMPLETED, run.error
    assert child not in worker.children()  # the pool child that charged was SIGKILLed
    key = durable.idempotency_key(run_id, 2)
    assert testing.assert_effects_once(run_id, partner=effects) == {key: 1}
    assert requests(key) == 2


# --- layers ------------------------------------------------------------------------------------
def test_layers__testing_never_imports_this_repositorys_tests() -> None:
    """A host has no `tests.support`. (That the engine imports neither agentflow.testing nor
    the site or domain is pyproject.toml's import contracts.)"""
    for path in sorted((ROOT / "agentflow" / "testing").rglob("*.py")):
        tree = ast.parse(path.read_text())
        found = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.Import)
            for alias in node.names
        }
        found |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not [m for m in found if m.split(".")[0] == "tests"], path.relative_to(ROOT)
