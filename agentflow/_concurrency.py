"""Concurrency keys: which runs may not run at once, named without keeping the name in clear.

A workflow declares `concurrency_key` (a function of the run's input) and `concurrency_limit`;
at most that many of its runs with one key are admitted at once, the others wait (WAITING, with
the reason) and are admitted in arrival order as admitted ones finish (docs/workflows.md,
"Concurrency keys"). The admission itself is the store's (`store.concurrency`): a
compare-and-set under the key's row lock, so it holds across every worker and host.

The key is often a customer's own reference (a booking, an account), so the run keeps only an
HMAC of it, under a key derived from the site's SECRET_KEY: two runs with one key compare
equal, and a database dump does not list bookings. Rotating SECRET_KEY splits the runs waiting
at that moment from those admitted before it; nothing else depends on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.utils.crypto import salted_hmac

from agentflow.exceptions import DefinitionError, InvalidInputError

#: The kind of hold a run over its key's cap waits on (`WorkflowRun.hold`: `concurrency:<digest>`).
HOLD = "concurrency"
#: The longest key text hashed: a key is a reference, not a document.
KEY_MAX_CHARS = 1000
_SALT = "agentflow.concurrency-key"


def declared(workflow: str, key: Callable[[Any], str] | None, limit: object) -> int | None:
    """A workflow's cap (1 when it names a key and no cap), or a DefinitionError."""
    if key is None:
        if limit is not None:
            raise DefinitionError(
                f"workflow {workflow!r}: concurrency_limit needs a concurrency_key to count by"
            )
        return None
    if not callable(key):
        raise DefinitionError(
            f"workflow {workflow!r}: concurrency_key is a function of the run's input, not {key!r}"
        )
    if limit is None:
        return 1
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise DefinitionError(
            f"workflow {workflow!r}: concurrency_limit is a whole number of at least 1, "
            f"not {limit!r}"
        )
    return limit


def digest(workflow: str, key: str) -> str:
    """The stored form of `key` for runs of `workflow`: 64 hex characters."""
    return salted_hmac(_SALT, f"{workflow}\0{key}", algorithm="sha256").hexdigest()


def key_of(workflow: str, key: Callable[[Any], str], input: Any) -> str:
    """The run's key from its input, as the workflow's function says; an InvalidInputError when
    it raises or says something that is no key (empty, not text, too long)."""
    try:
        value = key(input)
    except Exception as exc:
        raise InvalidInputError(
            f"{workflow}: the concurrency key could not be read from the input "
            f"({type(exc).__name__})"
        ) from None
    if not isinstance(value, str) or not value or len(value) > KEY_MAX_CHARS:
        raise InvalidInputError(
            f"{workflow}: a concurrency key is text of 1-{KEY_MAX_CHARS} characters"
        )
    return value


def token(digest: str) -> str:
    """The run's hold while it waits for its key (`routing.Hold` reads it back)."""
    return f"{HOLD}:{digest}"


def reason(workflow: str, limit: int) -> str:
    """Why a run waits for its key, as its page and `durable.snapshot` say it."""
    running = "another run" if limit == 1 else f"{limit} other runs"
    return (
        f"waiting for its turn: {running} of {workflow} with the same concurrency key "
        f"{'is' if limit == 1 else 'are'} running"
    )
