"""The recorded values of a run's sensitive arguments (agentflow.sensitive): what the admin masks
for those who may not read them, and what the engine masks in the lines it logs.

Read from where the engine records a call's arguments: the run's approval waits (every branch),
its tool calls' checkpoints, current and superseded, and the events that keep a call a wait was
recorded, replaced or decided for.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from agentflow.models import RunEvent, RunWait, StepCheckpoint, SupersededStep
from agentflow.sensitive import Sensitive, texts
from agentflow.states import WaitKind

#: Events whose data copy a call's arguments: the wait recorded, replaced, decided.
_CALL_EVENTS = (
    RunEvent.Kind.WAITING,
    RunEvent.Kind.OPERATOR_APPROVE,
    RunEvent.Kind.OPERATOR_REJECT,
)


def sensitive_values(run_id: str, declared: Mapping[str, Sensitive] | None) -> list[str]:
    """The run's values of the sensitive arguments `declared` by call name; None (a definition
    this code does not have, which cannot say) takes every approval and tool argument's text."""
    return list(_values(run_id, declared))


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
