"""The airline's signed flight notices (docs/refunds.md, "A cancelled flight"): verified as
partner webhooks are (`agentflow.webhooks.verified`: HMAC-SHA256 of "<t>.<body>" under
REFUNDS_AIRLINE_SECRET, a timestamp inside the tolerance), then one `flight_cancelled` run per
notice. The notice's id is the run's business key, so the airline's repeated delivery, or the
same request replayed, starts nothing twice.

200 `{"run_id"}`; 400 (one WARNING line, never the body): a bad signature, a stale timestamp,
a body that is not a notice; 404: notices are off (no secret set).
"""

from __future__ import annotations

import json
import logging
import re
from datetime import date

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.utils.log import log_response
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agentflow import durable, webhooks

logger = logging.getLogger(__name__)

#: What a notice names: a Skyways flight, as the airline numbers them.
_FLIGHT = re.compile(r"SK[0-9]{3,4}")
#: The body of a notice: a few hundred bytes.
MAX_BODY_BYTES = 10_000


@csrf_exempt
@require_POST
def airline_notice(request: HttpRequest) -> JsonResponse:
    secret = settings.REFUNDS_AIRLINE_SECRET
    if not secret:
        return JsonResponse({"error": "flight notices are not configured"}, status=404)
    try:
        if request.content_type != "application/json":
            raise webhooks.Refused(415, "the body is sent as application/json")
        if int(request.META.get("CONTENT_LENGTH") or 0) > MAX_BODY_BYTES:
            raise webhooks.Refused(413, "the body is larger than a notice")
        body = request.body
        webhooks.verified(request.headers.get(webhooks.SIGNATURE_HEADER, ""), body, [secret])
        flight, day, notice_id = _notice(body)
    except (webhooks.Refused, ValueError) as refused:
        status = refused.status if isinstance(refused, webhooks.Refused) else 400
        reason = refused.reason if isinstance(refused, webhooks.Refused) else "unreadable"
        response = JsonResponse({"error": reason}, status=status)
        log_response(
            "airline notice refused: %s",
            reason,
            response=response,
            request=request,
            logger=logger,
            level="warning",
        )
        return response
    run_id = durable.start(
        "flight_cancelled",
        input={"flight": flight, "date": day, "notice": notice_id},
        business_key=notice_id,
    )
    return JsonResponse({"run_id": run_id})


def _notice(body: bytes) -> tuple[str, str, str]:
    try:
        found = json.loads(body)
    except (ValueError, RecursionError):
        raise webhooks.Refused(400, "the body is not JSON") from None
    if not isinstance(found, dict) or found.get("type") != "flight.cancelled":
        raise webhooks.Refused(400, "the body is not a flight.cancelled notice")
    flight, day, notice_id = found.get("flight"), found.get("date"), found.get("id")
    if not isinstance(flight, str) or not _FLIGHT.fullmatch(flight):
        raise webhooks.Refused(400, "the notice names no Skyways flight")
    try:
        date.fromisoformat(day if isinstance(day, str) else "")
    except ValueError:
        raise webhooks.Refused(400, "the notice's date is not YYYY-MM-DD") from None
    if not isinstance(notice_id, str) or not 0 < len(notice_id) <= 200:
        raise webhooks.Refused(400, "the notice has no id")
    return flight, day, notice_id
