"""Customer-facing refund URLs."""
from __future__ import annotations

app_name = "refunds"
urlpatterns: list = []
