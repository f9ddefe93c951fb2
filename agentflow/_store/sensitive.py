"""The recorded values of a run's sensitive arguments (agentflow._core.sensitive): what the admin
masks
for those who may not read them, and what the engine masks in the lines it logs (`masked`).

Read from where the engine records a call's arguments: the run's approval waits (every branch),
its tool calls' checkpoints, current and superseded, and the events that keep a call a wait was
recorded, replaced or decided for; and from the run's input, for the keys its workflow declares
`sensitive_input`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from django.db import DatabaseError, transaction

from agentflow._base.states import WaitKind
from agentflow._core import registry
from agentflow._core.sensitive import Redactor, Sensitive, texts
from agentflow.models import RunEvent, RunWait, StepCheckpoint, SupersededStep, WorkflowRun

#: Events whose data copy a call's arguments: the wait recorded, replaced, decided.
_CALL_EVENTS = (
    RunEvent.Kind.WAITING,
    RunEvent.Kind.OPERATOR_APPROVE,
    RunEvent.Kind.OPERATOR_REJECT,
)


def sensitive_values(
    run_id: str,
    declared: Mapping[str, Sensitive] | None,
    *,
    input_declared: Sensitive | None = None,
) -> list[str]:
    """The run's values of the sensitive arguments `declared` by call name; None (a definition
    this code does not have, which cannot say) takes every approval and tool argument's text.
    `input_declared`: the keys of the run's input to take too (its workflow's
    `sensitive_input`)."""
    found = list(_values(run_id, declared))
    if input_declared is not None:
        given = WorkflowRun.objects.filter(pk=run_id).values_list("input", flat=True).first()
        found.extend(input_declared.values(given))
    return found


def masked(run_id: str, text: str, *, workflow: registry.Workflow | None = None) -> str:
    """`text` (an error, a park's reason, a traceback) as the engine logs it: the values of the
    run's sensitive arguments masked, so no log line carries them whatever a step raised.
    `workflow`: the run's definition, when the caller has it (else it is looked up; one this
    code does not have masks every approval and tool argument)."""
    if not text or (workflow is not None and not workflow.declares_sensitive()):
        return text  # nothing to mask: no query
    try:
        with transaction.atomic():  # a savepoint: a failed read leaves the caller's intact
            if workflow is None:
                found = WorkflowRun.objects.filter(pk=run_id).values_list("workflow", "version")
                row = found.first()
                workflow = registry.lookup(*row) if row is not None else None
            if workflow is not None and not workflow.declares_sensitive():
                return text  # nothing in this workflow is sensitive
            declared = workflow.sensitive_calls() if workflow is not None else None
            of_input = workflow.sensitive_input if workflow is not None else None
            values = sensitive_values(run_id, declared, input_declared=of_input)
    except DatabaseError:
        return "(not logged: the run's sensitive values, to mask in it, could not be read)"
    return Redactor(values).text(text)


def _values(run_id: str, declared: Mapping[str, Sensitive] | None) -> Iterator[str]:
    names = list(declared) if declared is not None else None
    if names == []:
        return
    waits = RunWait.objects.filter(run_id=run_id, kind=WaitKind.APPROVAL)
    if names is not None:
        waits = waits.filter(name__in=names)
    for name, arguments in waits.values_list("name", "arguments"):
        yield from _of(declared, name, arguments)
    for model in (StepCheckpoint, SupersededStep):
        calls = model.objects.filter(run_id=run_id, arguments__kind="tool")
        if names is not None:
            calls = calls.filter(name__in=names)
        for name, arguments in calls.values_list("name", "arguments"):
            if isinstance(arguments, dict):
                yield from _of(declared, name, arguments.get("arguments"))
    events = RunEvent.objects.filter(run_id=run_id, kind__in=_CALL_EVENTS)
    for data in events.values_list("data", flat=True):
        if not isinstance(data, dict):
            continue
        for call in (data, data.get("replaced")):
            if isinstance(call, dict):
                called = call.get("name") or call.get("call")
                yield from _of(declared, called, call.get("arguments"))


def _of(declared: Mapping[str, Sensitive] | None, name: Any, arguments: Any) -> Iterator[str]:
    if not isinstance(arguments, dict):
        return
    if declared is None:
        yield from texts(arguments, numbers=False)
        return
    sensitive = declared.get(name) if isinstance(name, str) else None
    if sensitive is not None:
        yield from sensitive.values(arguments)
