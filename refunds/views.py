"""Customer pages: the rebooking form, the status page and its JSON, friendly error pages."""

from __future__ import annotations

import math
from typing import Any

from django.contrib import messages
from django.db import DatabaseError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.cache import patch_cache_control
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_safe

from agentflow import durable, middleware
from refunds import engines, policy, progress, proxies, services, waivers
from refunds.forms import RefundRequestForm, new_submission_token, unsign_submission_token
from refunds.models import RefundRequest

#: Step outputs the page reads: the fee worked out, the failure explanation that
#: `notify_failure` told the customer (a sentence of `refunds.wording`, never a step's error),
#: and through `progress.outcome_details` what the run changed.
_FEE_STEP = "calculate_penalty_fee"
_NOTICE_STEP = "notify_failure"


@require_http_methods(["GET", "HEAD", "POST"])
def refund_new(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        form = RefundRequestForm(initial={"submission_token": new_submission_token()})
        response = _form_page(request, form)
        # A new visit fetches a new token (max-age=0), but the back button may show the page
        # it left, token and all (no `no-store`, which would also bar the back/forward
        # cache), so sending it again finds the same refund.
        patch_cache_control(response, private=True, max_age=0)
        return response
    form = RefundRequestForm(request.POST)
    # The token decides first: a form sent again goes to its refund even if its fields would
    # no longer validate.
    signed = str(form["submission_token"].value() or "")
    nonce = unsign_submission_token(signed)
    if nonce is None:
        return _stale_form_page(request)
    try:
        return _take(request, form, nonce)
    except DatabaseError as exc:
        if not middleware.database_unreachable(exc, "taking a refund request"):
            raise
        return _unavailable_form_page(request)


def _take(request: HttpRequest, form: RefundRequestForm, nonce: str) -> HttpResponse:
    """The request a genuine form's token names: the one it made before, or a new one."""
    earlier = services.refund_request_by_token(nonce)
    if earlier is not None:
        # Double click, back button or replay: the one refund this form rendering made.
        if form.is_valid() and not _same_request(earlier, form.cleaned_data):
            messages.info(
                request,
                "You had already sent this form, so we kept your first request. "
                "To ask for something else, start a new request.",
            )
        return _see_status(earlier)
    if not form.is_valid():
        return _form_page(request, form, status=400)
    data = form.cleaned_data
    ip = proxies.client_key(request)
    refused = services.refusal(
        email=data["email"],
        booking_reference=data["booking_reference"],
        last_name=data["last_name"],
        client_ip=ip,
    )
    if refused is not None:
        return _too_many(request, refused.retry_after, per_booking=refused.per_booking)
    refund = services.refund_request_create(
        email=data["email"],
        booking_reference=data["booking_reference"],
        last_name=data["last_name"],
        message=data["message"],
        waiver_reason=data["waiver_reason"],
        waiver_details=data["waiver_details"],
        submission_token=nonce,
        client_ip=ip,
    )
    return _see_status(refund)


@never_cache
@require_safe
def refund_status(request: HttpRequest, public_id: str) -> HttpResponse:
    refund = _refund_or_404(public_id)
    return render(
        request,
        "refunds/status.html",
        {
            "refund": refund,
            "progress": _progress(refund, _snapshot(refund)),
            "status_url": reverse("refunds:status_json", args=[refund.public_id]),
            "waiver_reason": policy.waiver_reason_words(refund.waiver_reason)
            if refund.waiver_reason
            else "",
        },
    )


@never_cache
@require_safe
def refund_status_json(request: HttpRequest, public_id: str) -> JsonResponse:
    refund = _refund_or_404(public_id)
    run = _snapshot(refund)
    if run is not None:
        status: str | None = run.status
    else:  # null: the run was deleted by retention (see _progress)
        status = None if _purged(refund, run) else durable.RunStatus.PENDING.value
    return JsonResponse(
        {
            "id": refund.public_id,
            "status": status,
            "workflow_id": refund.workflow_id,
            # "approval" while a fee waiver waits for our team (docs/refunds.md, "The status page"),
            # else null.
            "waiting_for": run.waiting_for if run else None,
            "steps": [
                {"seq": s.seq, "name": s.name, "status": s.status, "attempts": s.attempts}
                for s in (run.steps if run else [])
            ],
            "customer": _progress(refund, run).as_json(),
        }
    )


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: an expired or missing cookie gets words, not Django's debug page."""
    return render(request, "refunds/csrf_failure.html", status=403)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler400 without Django's CSRF re-check: the stock view re-reads the body that just
    failed (e.g. a non-UTF-8 form charset) and turns a 400 into a 500."""
    return HttpResponseBadRequest(render_to_string("400.html"))


# --- helpers ------------------------------------------------------------------------------------
def _form_page(
    request: HttpRequest, form: RefundRequestForm, *, status: int = 200, stale: bool = False
) -> HttpResponse:
    return render(request, "refunds/new.html", {"form": form, "stale": stale}, status=status)


def _too_many(request: HttpRequest, retry_after: int, *, per_booking: bool) -> HttpResponse:
    response = render(
        request,
        "refunds/too_many.html",
        {"retry_minutes": max(1, math.ceil(retry_after / 60)), "per_booking": per_booking},
        status=429,
    )
    response["Retry-After"] = str(retry_after)
    return response


def _unavailable_form_page(request: HttpRequest) -> HttpResponse:
    """The database did not answer: 503 with `Retry-After`, and the form as they sent it, token
    and all. Sent again once the database is back, that token finds the request if this one
    was made after all (its answer lost with the connection), or makes it: never two."""
    form = RefundRequestForm(request.POST)
    response = render(request, "refunds/new.html", {"form": form, "unavailable": True}, status=503)
    return middleware.retry_later(response)


def _stale_form_page(request: HttpRequest) -> HttpResponse:
    """Tampered, expired or missing token: nothing is created, and what they typed stays,
    under a fresh token they can submit once they have checked it."""
    data = request.POST.copy()
    data["submission_token"] = new_submission_token()
    form = RefundRequestForm(data)
    form.is_valid()  # field errors show next to the kept input too
    return _form_page(request, form, status=400, stale=True)


def _see_status(refund: RefundRequest) -> HttpResponse:
    response = redirect("refunds:status", public_id=refund.public_id)
    response.status_code = 303  # POST-redirect-GET: the browser must not re-POST
    return response


def _refund_or_404(public_id: str) -> RefundRequest:
    refund = RefundRequest.objects.filter(public_id=public_id).first()
    if refund is None:
        raise Http404("no such refund request")
    return refund


def _same_request(refund: RefundRequest, data: dict[str, Any]) -> bool:
    fields = (
        "email",
        "booking_reference",
        "last_name",
        "message",
        "waiver_reason",
        "waiver_details",
    )
    return all(getattr(refund, name) == data[name] for name in fields)


def _snapshot(refund: RefundRequest) -> durable.RunSnapshot | None:
    return durable.snapshot(refund.workflow_id) if refund.workflow_id else None


def _purged(refund: RefundRequest, run: durable.RunSnapshot | None) -> bool:
    """The request names a run that no longer exists. The two are created in one transaction,
    so its run was finished and then deleted by retention (`manage.py purge`,
    docs/protocol.md, "Retention")."""
    return run is None and bool(refund.workflow_id)


def _progress(refund: RefundRequest, run: durable.RunSnapshot | None) -> progress.Progress:
    if _purged(refund, run):
        return progress.archived()
    waiver_asked = bool(refund.waiver_reason)
    if run is None:  # not expected (the run is created with the request), but never a 500
        return progress.describe(
            status=durable.RunStatus.PENDING,
            current_step="",
            steps=[],
            planned=engines.planned(run, waiver_asked=waiver_asked),
        )
    steps = engines.customer_steps(run, waiver_asked=waiver_asked)
    outputs = engines.outputs(steps)
    notice = outputs.get(_NOTICE_STEP, {})
    return progress.describe(
        status=run.status,
        current_step=run.current_step,
        steps=steps,
        planned=engines.planned(run, waiver_asked=waiver_asked),
        fee_cents=_fee_cents(outputs),
        reason=_customer_reason(notice),
        emailed=notice.get("sent") is True,
        details=progress.outcome_details(run.status, outputs),
        outputs=outputs,
        # The refund's one approval is the fee waiver's.
        awaiting_approval=waivers.STEP if run.waiting_for == "approval" else "",
    )


def _fee_cents(outputs: dict[str, dict[str, Any]]) -> int | None:
    """The fee the run worked out, once it has; the page says $45 until then."""
    value = outputs.get(_FEE_STEP, {}).get("amount_cents")
    if value is None:  # an agent run: the policy's answer carries the fee
        value = outputs.get("check_cancellation_policy", {}).get("fee_cents")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _customer_reason(notice: dict[str, Any]) -> str:
    """The explanation `notify_failure` told the customer, mailed or not (the page shows it
    only if it is one of `refunds.wording`'s failure sentences)."""
    value = notice.get("reason")
    return value[:500] if isinstance(value, str) else ""
