"""Every `AGENTFLOW_*` setting and its default: a host sets only what it changes.

Engine code reads settings through `agentflow._conf.settings`, which answers a host's own value
when it has one and the default here otherwise; any other name is Django's setting as usual,
so it is a drop-in for `django.conf.settings` (and `override_settings` works on both). The
manual's settings table (docs/settings.md) lists the same names, defaults and meanings.
"""

from __future__ import annotations

import socket
from typing import Any

from django.conf import settings as django_settings

#: name -> (default, or a function that computes it once asked), what it does.
DEFAULTS: dict[str, tuple[Any, str]] = {
    "AGENTFLOW_BUILD_ID": (
        "",
        "The build this process runs (a release's git sha, an image tag): the same in web, "
        "worker and beat of one release. Empty: a digest of the registered workflow definitions.",
    ),
    "AGENTFLOW_LEASE_SECONDS": (10, "Seconds a claimed step's lease lasts between renewals."),
    "AGENTFLOW_SWEEP_INTERVAL": (1, "Seconds between recovery sweeps (in celery beat)."),
    "AGENTFLOW_SWEEP_BATCH": (1000, "Most runs one sweep re-publishes."),
    "AGENTFLOW_SWEEP_BACKOFF_MAX_SECONDS": (
        300.0,
        "The longest gap between the sweeper's re-publishes of a run no worker answers "
        "(the gap starts at one lease and doubles).",
    ),
    "AGENTFLOW_MAX_ATTEMPTS": (8, "Attempts of a step before its run fails (or parks)."),
    "AGENTFLOW_WORKFLOW_MODULES": (
        [],
        "Modules imported at start that define workflows, beside every installed app's "
        "`workflows.py`.",
    ),
    "AGENTFLOW_HOSTNAME": (socket.gethostname, "The host name owner tokens carry."),
    "AGENTFLOW_LIVENESS_DATABASE_URL": (
        "",
        'Where worker liveness locks are held: "" the default database, "off" leases only; '
        "behind PgBouncer in transaction mode, a direct URL to Postgres.",
    ),
    "AGENTFLOW_DB_PREPARED_STATEMENTS": (
        "auto",
        'Server-side prepared statements: "on" (PgBouncer 1.21+ with max_prepared_statements, '
        'or no pooler), "off", "auto" off on a connection a pooler answers (its backend pid '
        "is not the server's) and, once a statement is lost, for the process (run again).",
    ),
    "AGENTFLOW_MAX_BACKOFF": (300.0, "The longest retry back-off a partner's Retry-After gets."),
    "AGENTFLOW_KEY_WINDOW_SECONDS": (
        24 * 3600.0,
        "How long partners keep idempotency keys (Stripe: 24 h): an older effect is never "
        "retried blindly.",
    ),
    "AGENTFLOW_CLOCK_OFFSET_SECONDS": (
        0.0,
        "Tests only, with AGENTFLOW_FAULTS=1 in the environment: this process's clock skew.",
    ),
    "AGENTFLOW_MASTER_KEYS": (
        [],
        'Master keys that wrap each person\'s data key ("id:key", 32 bytes URL-safe base64): '
        "the first wraps, every one unwraps (docs/privacy.md). Empty: personal fields are "
        "stored in clear (and `check` warns with DEBUG off).",
    ),
    "AGENTFLOW_KEYSTORE_DATABASE": (
        "default",
        "The Django database alias holding subject keys; another than the data's, with "
        "agentflow.routers.KeystoreRouter, lets a restored backup of the data stay erased "
        "(docs/privacy.md).",
    ),
    "AGENTFLOW_RETENTION_DAYS": (30, "Finished runs older than this are deleted; 0 keeps all."),
    "AGENTFLOW_LLM_BASE_URL": (
        "",
        "An OpenAI-compatible server for agent runs (needs django-agentflow[agent]); empty: each "
        "workflow's scripted planner.",
    ),
    "AGENTFLOW_LLM_MODEL": ("", "The model agent runs ask (required with a base URL)."),
    "AGENTFLOW_LLM_API_KEY": ("", "The model server's API key."),
    "AGENTFLOW_LLM_TIMEOUT_SECONDS": (60, "One model request's budget."),
    "AGENTFLOW_LLM_FALLBACKS": (
        [],
        "Model servers tried in order after AGENTFLOW_LLM_BASE_URL when it fails: JSON (or "
        'the same list) of {"base_url", "model", "api_key"}.',
    ),
    "AGENTFLOW_AGENT_MAX_TURNS": (20, "Model turns per agent run."),
    "AGENTFLOW_AGENT_MAX_TOKENS": (100_000, "Model tokens per agent run."),
    "AGENTFLOW_AGENT_MAX_TOOL_CALLS": (40, "Tool calls per agent run."),
    "AGENTFLOW_AGENT_MAX_COST_USD": (
        None,
        "Dollars one agent run's model requests may cost (None: no cap); a request that could "
        "pass it is not sent, and a lost answer counts at its worst case.",
    ),
    "AGENTFLOW_LLM_MAX_OUTPUT_TOKENS": (
        4096,
        "The max_tokens each model request is sent with: what bounds a lost answer's cost.",
    ),
    "AGENTFLOW_APPROVAL_TIMEOUT": (
        48 * 3600.0,
        "Seconds a call declared requires_approval waits for a decision before it is rejected.",
    ),
    "AGENTFLOW_WEBHOOK_SECRETS": (
        {},
        "Partner -> the secret (or a list of secrets, while rotating) that signs its webhooks "
        "to agentflow.webhooks.signal_webhook; a partner without one is answered 404.",
    ),
    "AGENTFLOW_WEBHOOK_TOLERANCE_SECONDS": (
        300.0,
        "How far a signed webhook's timestamp may be from this server's clock: an older "
        "request is refused as a replay.",
    ),
    "AGENTFLOW_PARTNER_LIMITS": (
        {},
        'Limits per partner key for the whole fleet, JSON or a dict: {"stripe": {"rate": '
        '"25/s"}, "airline": {"concurrency": 3}}; a named partner also gets a breaker.',
    ),
    "AGENTFLOW_PARTNER_RECOVERY_SECONDS": (
        30.0,
        "Seconds a partner's key takes to climb back to its full rate after a 429 slowed it "
        "or its breaker closed.",
    ),
    "AGENTFLOW_PARTNER_SLOT_SECONDS": (
        60.0,
        "A partner call's lease on its place in flight: a worker killed mid-call frees it "
        "when its process is gone, or at the latest after this.",
    ),
    "AGENTFLOW_BREAKER_FAILURES": (
        5,
        "Consecutive timeouts, 5xx or connection errors that open a limited partner's "
        "breaker (0: never).",
    ),
    "AGENTFLOW_BREAKER_COOLDOWN_SECONDS": (
        5.0,
        "Seconds from a breaker opening to its first probe (doubled per refused probe, up to 60).",
    ),
    "AGENTFLOW_SCHEDULES": (
        {},
        'Schedules kept in the host\'s settings, beside those declared in code: {"name": '
        '{"workflow": ..., "cron": "0 2 * * *", "time_zone": "UTC", "input": {...}, '
        '"catch_up_seconds": 3600, "overlap": "skip"}} (docs/schedules.md).',
    ),
    "AGENTFLOW_DEFAULT_PRIORITY": (
        None,
        "The priority (0-9, higher first) of a run whose workflow and start give none; None "
        "publishes its steps without one (docs/workflows.md, Priorities).",
    ),
    "AGENTFLOW_CONCURRENCY_SWEEP_KEYS": (
        200,
        "Most concurrency keys one sweep looks at for runs that may start (a hand-off lost "
        "in a crash).",
    ),
    "AGENTFLOW_METRICS_TOKEN": ("", "Bearer token the metrics view requires when set."),
    "AGENTFLOW_METRICS_PUBLIC": (
        False,
        "Serve metrics without a token with DEBUG off (a private network).",
    ),
}


class Settings:
    """`django.conf.settings`, with the defaults above for names a host did not set."""

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(django_settings, name)
        except AttributeError:
            if name not in DEFAULTS:
                raise
        default = DEFAULTS[name][0]
        return default() if callable(default) else default


settings = Settings()
