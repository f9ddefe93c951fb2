#!/usr/bin/env python
"""Django's command-line entry point."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        # The settings refused the environment (no secret key, a malformed variable): the
        # reason is the whole message, not the end of a traceback through importlib.
        sys.exit(f"manage.py: {exc}")


if __name__ == "__main__":
    main()
