"""Stripe's idempotency rules for every effect endpoint: store the first answer and replay it.

Order for one request: count it; draw faults (an injected error answers before execution and is
not stored); validate (a rejection is not stored); claim the key (in flight → 409, other params →
400, already answered → replay); sleep any latency with the key in flight; execute and store the
answer in the same transaction as the effect; drop the connection if the fault says so.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from refunds.sandbox import faults
from refunds.sandbox.messages import Request, Response, stripe_error
from refunds.sandbox.state import Store

Parse = Callable[[Request], dict[str, Any]]
Execute = Callable[[sqlite3.Connection, dict[str, Any], str | None], Response]


@dataclass(frozen=True, kw_only=True)
class Effect:
    """One effect endpoint: its name (counters, faults), key scope, validation and execution."""

    name: str
    scope: str
    key_required: bool
    parse: Parse
    execute: Execute
    injected: Callable[[int], Response]


def run_effect(
    store: Store, effect: Effect, request: Request, *, key_window_seconds: float
) -> Response:
    """Answer one effect request under the idempotency rules (see the module docstring)."""
    store.count("requests", effect.name)
    fault = faults.plan(store, effect.name)
    if fault.error_status is not None:
        return effect.injected(fault.error_status)
    params = effect.parse(request)
    key = request.header("Idempotency-Key")
    if not key:
        if effect.key_required:
            return stripe_error(400, "invalid_request_error", "Idempotency-Key header required")
        _sleep(fault.latency_ms)
        with store.transaction() as db:
            response = effect.execute(db, params, None)
        return replace(response, drop=fault.drop)

    fingerprint = json.dumps([effect.name, params], sort_keys=True)
    claim = _claim(store, effect.scope, key, fingerprint, key_window_seconds)
    if claim.conflict is not None:
        return claim.conflict
    if claim.replay is not None:
        store.count("replays", effect.name)
        _sleep(fault.latency_ms)
        return replace(claim.replay, drop=fault.drop)
    _sleep(fault.latency_ms)
    try:
        with store.transaction() as db:
            response = effect.execute(db, params, key)
            db.execute(
                "UPDATE idempotency_keys SET status = ?, body = ? WHERE scope = ? AND key = ?",
                (response.status, json.dumps(response.body), effect.scope, key),
            )
    except BaseException:
        _release(store, effect.scope, key)
        raise
    return replace(
        response, headers={**response.headers, "Idempotent-Replayed": "false"}, drop=fault.drop
    )


@dataclass(frozen=True, kw_only=True)
class _Claim:
    """Neither set: this request owns the key and executes. Else the answer to give instead."""

    replay: Response | None = None
    conflict: Response | None = None


def _claim(store: Store, scope: str, key: str, fingerprint: str, window: float) -> _Claim:
    now = time.time()
    with store.transaction() as db:
        # Keys past the window are forgotten, so a reuse executes again (Stripe prunes after 24 h).
        db.execute(
            "DELETE FROM idempotency_keys WHERE created < ? AND status IS NOT NULL", (now - window,)
        )
        row = db.execute(
            "SELECT fingerprint, status, body FROM idempotency_keys WHERE scope = ? AND key = ?",
            (scope, key),
        ).fetchone()
        if row is None:
            db.execute(
                "INSERT INTO idempotency_keys (scope, key, fingerprint, created)"
                " VALUES (?, ?, ?, ?)",
                (scope, key, fingerprint, now),
            )
            return _Claim()
    if row["status"] is None:
        return _Claim(
            conflict=stripe_error(
                409,
                "idempotency_error",
                "There is currently another in-progress request using this Idempotent Key (that "
                "probably means you submitted twice, and the other request is still going "
                "through): "
                f"{key}. Please try again later.",
                code="idempotency_key_in_use",
            )
        )
    if row["fingerprint"] != fingerprint:
        return _Claim(
            conflict=stripe_error(
                400,
                "idempotency_error",
                "Keys for idempotent requests can only be used with the same parameters they were "
                f"first used with. Try using a key other than '{key}' if you meant to execute a "
                "different request.",
            )
        )
    stored = json.loads(row["body"])
    return _Claim(
        replay=Response(status=row["status"], body=stored, headers={"Idempotent-Replayed": "true"})
    )


def _release(store: Store, scope: str, key: str) -> None:
    """The execution failed without an answer: nothing is stored, so a retry may execute."""
    with store.transaction() as db:
        db.execute(
            "DELETE FROM idempotency_keys WHERE scope = ? AND key = ? AND status IS NULL",
            (scope, key),
        )


def _sleep(latency_ms: int) -> None:
    if latency_ms:
        time.sleep(latency_ms / 1000)
