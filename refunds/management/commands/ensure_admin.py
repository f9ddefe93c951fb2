"""`manage.py ensure_admin`: a local operator login for `make run`, created once."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model

from agentflow.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the local 'admin' superuser if missing and print its login."

    def handle(self, *args: Any, **options: Any) -> None:
        secret_file = Path(settings.VAR_DIR) / "admin-password.txt"
        if not secret_file.exists():
            secret_file.write_text(secrets.token_urlsafe(12))
            secret_file.chmod(0o600)
        password = secret_file.read_text().strip()
        users = get_user_model()
        user = users.objects.filter(username="admin").first()
        if user is None:
            users.objects.create_superuser("admin", "admin@localhost", password)
        elif not user.check_password(password):
            self.stdout.write("admin user exists with another password; leaving it alone")
            return
        self.stdout.write(f"Admin login: admin / {password}")
