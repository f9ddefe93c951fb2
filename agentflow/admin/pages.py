"""A console page on a model no operator edits by hand: its rows change only through the
page's own actions (Pause, Erase, Start a slot), each recorded with actor and reason."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


class ActionsOnlyAdmin(admin.ModelAdmin):
    """No add, change or delete forms; the subclass says who may view."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
