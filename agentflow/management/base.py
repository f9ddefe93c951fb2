"""What every command here is built on: bad input is one line on stderr and a non-zero exit.

Django prints a refusal the command raises (`CommandError`) as one line and exits 1, but an
argument the parser refuses (missing, not a number, not one of the choices) gets argparse's
usage, several lines of every option Django adds, and exit 2. Here the parser's refusal is one
line too, and exits 2: 1 says the command refused what it was asked, 2 that it was asked wrong.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from typing import Any

from django.core.management import base
from django.core.management.base import CommandError, CommandParser

#: The exit status of an argument the parser refused (argparse's own).
USAGE_ERROR = 2
#: A whole number as a person types it: ASCII digits, few enough that int() never refuses
#: them (it refuses thousands) and a count or a port is never absurd.
_WHOLE = re.compile(r"\s*-?[0-9]{1,15}\s*")


class BaseCommand(base.BaseCommand):
    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # Refusals raise CommandError, as they do under call_command, instead of printing
        # the usage and exiting.
        parser.called_from_command_line = False
        return parser

    def run_from_argv(self, argv: list[str]) -> None:
        try:
            super().run_from_argv(argv)
        except CommandError as exc:
            if "--traceback" in argv:  # the command's own, which Django raises on request
                raise
            # Django writes the command's own and exits; this one is the parser's.
            self.stderr.write(f"{type(exc).__name__}: {exc} (--help lists the arguments)")
            sys.exit(USAGE_ERROR)


def json_argument(text: str, option: str) -> Any:
    """`text` as JSON, or CommandError naming `option` (deep nesting included, which Python's
    json refuses with a RecursionError rather than a ValueError)."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandError(f"{option} is not JSON: {exc}") from None
    except RecursionError:
        raise CommandError(f"{option} is nested too deep to be read") from None


def whole(at_least: int, at_most: int | None = None) -> Callable[[str], int]:
    """An argparse `type`: a whole number from `at_least` (to `at_most`), else one line
    saying what it must be."""
    bounds = f"from {at_least} to {at_most}" if at_most is not None else f"of {at_least} or more"

    def parse(text: str) -> int:
        value = int(text) if _WHOLE.fullmatch(text) else None
        if value is None or value < at_least or (at_most is not None and value > at_most):
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not a whole number {bounds}")
        return value

    return parse


def number(at_least: float, *, inclusive: bool = True) -> Callable[[str], float]:
    """An argparse `type`: a finite number of `at_least` or more (or above it)."""
    bounds = f"{'of' if inclusive else 'above'} {at_least:g}{' or more' if inclusive else ''}"

    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) <= 40 else math.nan
        except ValueError:
            value = math.nan
        fits = value >= at_least if inclusive else value > at_least
        if not math.isfinite(value) or not fits:
            raise argparse.ArgumentTypeError(f"{_shown(text)} is not a number {bounds}")
        return value

    return parse


def _shown(text: str) -> str:
    """An argument as a refusal quotes it: short, on one line."""
    return repr(text if len(text) <= 40 else text[:40] + "...")
