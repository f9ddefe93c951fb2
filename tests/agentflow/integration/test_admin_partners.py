"""The operator's partner page (issue 27): each limited partner's limit, in flight, waiting runs,
recent 429s and errors, breaker; Pause and Resume under their own permission, recorded with the
operator and the reason; and the partner gauges on /metrics."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client, override_settings

from agentflow._limits import rules
from agentflow._limits import store as limits_store
from agentflow.models import PartnerEvent, PartnerState

pytestmark = pytest.mark.django_db

PAGE = "/admin/agentflow/partnerstate/"
LIMITS = {"stripe": {"rate": "25/s"}, "airline": {"concurrency": 3}}


def _staff(*, may_pause: bool) -> Client:
    user = User.objects.create_user("ops", password="pw", is_staff=True)
    perms = ["view_partnerstate", *(["pause_partnerstate"] if may_pause else [])]
    user.user_permissions.set(Permission.objects.filter(codename__in=perms))
    client = Client()
    client.force_login(user)
    return client


@override_settings(AGENTFLOW_PARTNER_LIMITS=LIMITS, AGENTFLOW_PARTNER_RECOVERY_SECONDS=36000)
def test_page__every_limited_partner_with_its_state() -> None:
    limit = rules.limit_for("stripe")
    assert limit is not None
    turn = limits_store.turn_take(limit)
    assert isinstance(turn, limits_store.Turn)
    limits_store.turn_return(limit, turn, outcome=limits_store.RATE_LIMITED, detail="charge: 429")

    page = _staff(may_pause=False).get(PAGE).content.decode()

    assert "25/s (now 50%)" in page  # slowed by the 429, climbing back
    assert "3 in flight" in page
    assert "Rate limited (429)" in page and "charge: 429" in page
    assert "Pause</button>" not in page  # viewing is not pausing


@override_settings(AGENTFLOW_PARTNER_LIMITS=LIMITS)
def test_pause_and_resume__need_their_permission__recorded_with_actor_and_reason() -> None:
    viewer = _staff(may_pause=False)
    assert viewer.post(f"{PAGE}airline/pause/", {"reason": "x"}).status_code == 403
    User.objects.all().delete()
    ops = _staff(may_pause=True)

    assert "Pause</button>" in ops.get(PAGE).content.decode()
    ops.post(f"{PAGE}airline/pause/", {"reason": "their maintenance window"})
    assert PartnerState.objects.get(partner="airline").paused
    assert "by ops: their maintenance window" in ops.get(PAGE).content.decode()
    ops.post(f"{PAGE}airline/resume/", {"reason": "they are back"})

    assert not PartnerState.objects.get(partner="airline").paused
    events = list(
        PartnerEvent.objects.order_by("id").values_list("partner", "kind", "actor", "detail")
    )
    assert events == [
        ("airline", "paused", "ops", "their maintenance window"),
        ("airline", "resumed", "ops", "they are back"),
    ]


@override_settings(AGENTFLOW_PARTNER_LIMITS=LIMITS, DEBUG=True)
def test_metrics__partner_gauges(client: Client) -> None:
    limit = rules.limit_for("airline")
    assert limit is not None
    assert isinstance(limits_store.turn_take(limit), limits_store.Turn)  # one call in flight

    text = client.get("/metrics").content.decode()

    assert 'agentflow_partner_in_flight{partner="airline"} 1.0' in text
    assert 'agentflow_partner_breaker_state{partner="stripe"} 0.0' in text
