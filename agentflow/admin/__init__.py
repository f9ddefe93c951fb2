"""The operator's Django admin for workflow runs, registered when admin autodiscovery imports it."""

from __future__ import annotations

from agentflow.admin.erasure import SubjectKeyAdmin
from agentflow.admin.partners import PartnerStateAdmin
from agentflow.admin.runs import WorkflowRunAdmin
from agentflow.admin.schedules import ScheduleStateAdmin

__all__ = ["PartnerStateAdmin", "ScheduleStateAdmin", "SubjectKeyAdmin", "WorkflowRunAdmin"]
