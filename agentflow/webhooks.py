"""Partner webhooks as signals: an optional view a host mounts, which delivers a signal only from
a request signed with that partner's secret, the way Stripe signs its webhooks.

    # the host's urls.py
    from agentflow import webhooks
    urlpatterns += [path("hooks/<slug:partner>/", webhooks.signal_webhook)]

    # its settings: a secret per partner (a list while rotating: any of them verifies)
    AGENTFLOW_WEBHOOK_SECRETS = {"airline": os.environ["AIRLINE_WEBHOOK_SECRET"]}

The partner POSTs a JSON object, `{"id": "evt_1", "run_id": "wf_…", "signal": "rebooked",
"payload": {…}}`, with the header `Agentflow-Signature: t=<unix seconds>,v1=<hex>`, where the
hex is HMAC-SHA256 under the secret of `"<t>.<body>"`, the body's exact bytes. The run id and
the signal's name are inside what is signed, so a signed body cannot be pointed at another run.

The body is sent as `Content-Type: application/json` (a `charset` parameter, if any, is
`utf-8`), at most DATA_UPLOAD_MAX_MEMORY_SIZE bytes (Django's limit on a request body).

400, delivering nothing: no or a bad signature, a timestamp further than
AGENTFLOW_WEBHOOK_TOLERANCE_SECONDS from this server's clock (an old request replayed), the
same signed request again within it (a receipt is kept while its timestamp is young), or a body
that is not such an object or that the database cannot store (see `serialization.to_json`:
NUL, nested too deep). A partner's own repeated delivery is signed afresh: it answers 200
and acts once, by its `id` (the signal id is `"<partner>:<id>"`, so two partners' ids never
collide). 409: the run refused it (finished, or no such run), with the reason; 404: no secret
for that partner; 413: a body over the limit; 415: another content type.

Each refusal is one WARNING line with its reason (never the body), and no traceback: these
requests come from anyone on the internet, and none of them is this server's fault.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig
from django.db import transaction
from django.http import HttpRequest, JsonResponse, UnreadablePostError
from django.utils.log import log_response
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from agentflow import _store as store
from agentflow import durable
from agentflow._conf import settings
from agentflow._core.serialization import MAX_DEPTH

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "Agentflow-Signature"
#: What the partner sends: JSON, in UTF-8 (JSON's own encoding).
CONTENT_TYPE = "application/json"
#: A header longer than this is no signature: `t=` and a `v1=` for each of a few secrets a
#: partner signs with while rotating take about 70 characters each.
MAX_HEADER_CHARS = 1024
#: ASCII digits only, and few of them: `str.isdigit` also passes "²" and "٣", which int()
#: refuses or reads, and int() refuses thousands of digits (Python's int_max_str_digits).
_TIMESTAMP = re.compile(r"[0-9]{1,20}")
#: An HMAC-SHA256 as `hexdigest()` writes it; anything else can never match (and
#: `hmac.compare_digest` refuses text that is not ASCII).
_SIGNATURE = re.compile(r"[0-9a-f]{64}")
#: Django reads Content-Length with int() when the body is read (a 500 on "abc" or "²").
_CONTENT_LENGTH = re.compile(r"[0-9]{1,20}")
#: A receipt outlives the tolerance by this much before it is pruned, so a clock step between
#: two requests cannot open a moment where a replay is neither stale nor remembered.
PRUNE_MARGIN_SECONDS = 60.0


class Refused(Exception):
    """A request that delivers nothing, with its HTTP status and the reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@csrf_exempt
@require_POST
def signal_webhook(request: HttpRequest, partner: str) -> JsonResponse:
    """Verify the request is `partner`'s, then deliver its signal (see the module)."""
    try:
        secrets = partner_secrets(partner)
        body = _body(request)
        signed_at = verified(request.headers.get(SIGNATURE_HEADER, ""), body, secrets)
        message = _message(body)
        delivery = _deliver(partner, signed_at, body, message)
    except Refused as refused:
        response = JsonResponse({"error": refused.reason}, status=refused.status)
        # Django's request logger would add a second line ("Bad Request: ..."): this one,
        # with the reason, stands for it.
        log_response(
            "webhook of %s refused: %s",
            partner,
            refused.reason,
            response=response,
            request=request,
            logger=logger,
            level="warning",
        )
        return response
    return JsonResponse({"result": delivery, "signal_id": message["signal_id"]})


def partner_secrets(partner: str) -> list[str]:
    """The partner's secrets, from AGENTFLOW_WEBHOOK_SECRETS (Refused 404 without one)."""
    configured = settings.AGENTFLOW_WEBHOOK_SECRETS
    if not isinstance(configured, dict):
        raise ImproperlyConfigured("AGENTFLOW_WEBHOOK_SECRETS is a dict: partner -> secret(s)")
    found = configured.get(partner)
    if found is None:
        raise Refused(404, f"no webhook secret for partner {partner!r}")
    secrets = [found] if isinstance(found, str) else found
    if (
        not isinstance(secrets, list)
        or not secrets
        or not all(isinstance(s, str) and s for s in secrets)
    ):
        raise ImproperlyConfigured(
            f"AGENTFLOW_WEBHOOK_SECRETS[{partner!r}] is a secret, or a list of them"
        )
    return secrets


def sign(secret: str, body: bytes, *, timestamp: int) -> str:
    """The header value a partner sends with `body` at `timestamp` (for its side, and tests)."""
    return f"t={timestamp},v1={_digest(secret, timestamp, body)}"


def verified(header: str, body: bytes, secrets: Sequence[str]) -> int:
    """The signed timestamp of a request whose signature one of `secrets` made and whose
    timestamp is within the tolerance of this server's clock; else Refused 400 saying which."""
    timestamp, signatures = _parse(header)
    expected = [_digest(secret, timestamp, body) for secret in secrets]
    if not any(hmac.compare_digest(e, s) for e in expected for s in signatures):
        raise Refused(400, "the signature does not match the body")
    tolerance = _tolerance()
    if abs(time.time() - timestamp) > tolerance:
        raise Refused(400, f"the timestamp is more than {tolerance:g} s from now")
    return timestamp


def _body(request: HttpRequest) -> bytes:
    """The body, if it is what a partner sends (Refused 415, 400 or 413 if not)."""
    charset = (request.content_params or {}).get("charset", "utf-8").lower()
    if request.content_type != CONTENT_TYPE or charset not in ("utf-8", "utf8"):
        raise Refused(415, f"the body is sent as {CONTENT_TYPE} (UTF-8)")
    length = request.META.get("CONTENT_LENGTH") or "0"
    if not isinstance(length, str) or not _CONTENT_LENGTH.fullmatch(length):
        raise Refused(400, "the Content-Length header is not a number of bytes")
    try:
        return request.body
    except RequestDataTooBig:
        raise Refused(413, "the body is larger than this server accepts") from None
    except UnreadablePostError:
        raise Refused(400, "the body could not be read to its end") from None


def _parse(header: str) -> tuple[int, list[str]]:
    if len(header) > MAX_HEADER_CHARS:
        raise Refused(400, f"the {SIGNATURE_HEADER} header is over {MAX_HEADER_CHARS} characters")
    timestamp: int | None = None
    signatures: list[str] = []
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        if key == "t" and _TIMESTAMP.fullmatch(value):
            timestamp = int(value)
        elif key == "v1" and _SIGNATURE.fullmatch(value):
            signatures.append(value)
    if timestamp is None or not signatures:
        raise Refused(400, f"no {SIGNATURE_HEADER} header of the form t=<seconds>,v1=<hex>")
    return timestamp, signatures


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    signed = f"{timestamp}.".encode() + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def _tolerance() -> float:
    value = settings.AGENTFLOW_WEBHOOK_TOLERANCE_SECONDS
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ImproperlyConfigured("AGENTFLOW_WEBHOOK_TOLERANCE_SECONDS is seconds above 0")
    return float(value)


def _message(body: bytes) -> dict[str, Any]:
    try:
        found = json.loads(body)
    except ValueError:  # UnicodeDecodeError and int()'s digit limit included
        raise Refused(400, "the body is not JSON") from None
    except RecursionError:
        raise Refused(400, f"the body is nested deeper than {MAX_DEPTH} levels") from None
    if not isinstance(found, dict):
        raise Refused(400, "the body is not a JSON object")
    for field in ("id", "run_id", "signal"):
        if not isinstance(found.get(field), str) or not found[field]:
            raise Refused(400, f"the body has no {field!r} (a non-empty string)")
    return {
        "run_id": found["run_id"],
        "name": found["signal"],
        "payload": found.get("payload"),
        "signal_id": found["id"],
    }


def _deliver(partner: str, timestamp: int, body: bytes, message: dict[str, Any]) -> str:
    """The receipt and the signal in one commit: a replay is refused, and a request whose
    signal the run refused leaves no receipt (sent again, it is refused again, for its reason)."""
    digest = hashlib.sha256(f"{timestamp}.".encode() + body).hexdigest()
    now = time.time()
    try:
        with transaction.atomic():
            store.webhook_receipt_add(
                partner,
                digest,
                signed_at=datetime.fromtimestamp(timestamp, UTC),
                prune_before=datetime.fromtimestamp(now - _tolerance() - PRUNE_MARGIN_SECONDS, UTC),
            )
            return durable.signal(
                message["run_id"],
                message["name"],
                message["payload"],
                signal_id=f"{partner}:{message['signal_id']}",
            )
    except store.Replayed as exc:
        raise Refused(400, str(exc)) from None
    except durable.ActionRefused as exc:
        raise Refused(409, str(exc)) from None
    except durable.InvalidInputError as exc:
        raise Refused(400, str(exc)) from None
