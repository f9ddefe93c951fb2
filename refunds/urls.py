"""Customer-facing refund URLs (docs/refunds.md, "The status page")."""

from __future__ import annotations

from django.urls import path, re_path
from django.views.generic import RedirectView

from refunds import notices, views

app_name = "refunds"

#: `rf_` + 22 URL-safe characters today; a little slack, and nothing else reaches the database.
_PUBLIC_ID = r"(?P<public_id>rf_[A-Za-z0-9_-]{8,37})"

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="refunds:new", permanent=False), name="index"),
    path("new/", views.refund_new, name="new"),
    path("airline/notices/", notices.airline_notice, name="airline_notice"),
    re_path(rf"^{_PUBLIC_ID}/$", views.refund_status, name="status"),
    re_path(rf"^{_PUBLIC_ID}/status\.json$", views.refund_status_json, name="status_json"),
]
