"""This site's Django, Celery and engine settings, all read from the environment (docs/settings.md,
"This repository's site").

Two shapes: with no environment set, the embedded default (SQLite and kombu's filesystem
transport under `var/`, no server needed); with DATABASE_URL and CELERY_BROKER_URL, the
production shape (Postgres through psycopg 3, Redis broker, no result backend).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
import django
from csp.constants import NONCE, NONE, SELF
from django.core.exceptions import ImproperlyConfigured

from agentflow import logs
from config import deployment, keys
from config.env import env_bool, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("AGENTFLOW_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)  # sessions and customers' data: ours alone

# --- Django core -----------------------------------------------------------------------------
DEBUG = env_bool("DJANGO_DEBUG", False)
# Refuses to start with DEBUG off and no key (or a published one): see config.deployment.
SECRET_KEY = deployment.secret_key(debug=DEBUG)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",  # admin login attempts limited per client address (see Admin login below)
    "agentflow",
    "config.bench",  # `manage.py bench` and its workflows (opt-in, as any host's)
    "refunds.apps.RefundsConfig",
]
# Django's own `@task` functions run as durable runs on this site's workers
# (docs/tasks-backend.md); on Django 5.2 through the backport, whose app brings the
# framework's checks and logging.
TASKS = {"default": {"BACKEND": "agentflow.tasks_backend.DurableTaskBackend"}}
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")

MIDDLEWARE = [
    "agentflow.middleware.RequestSpanMiddleware",  # first, so the span covers the whole request
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",  # a Content-Security-Policy on every response (below)
    "whitenoise.middleware.WhiteNoiseMiddleware",  # static files without a separate server
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # A page that finds the database down answers 503 ("the database is unreachable" in the
    # admin), logged once per outage, not the 500 page with a traceback per request.
    "agentflow.middleware.DatabaseOutageMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as axes asks: turns a lockout into its page
]

ROOT_URLCONF = "config.urls"
CSRF_FAILURE_VIEW = "refunds.views.csrf_failure"  # a friendly page, not Django's debug text
WSGI_APPLICATION = "config.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- HTTPS, behind a TLS-terminating proxy or not (all off for `make run` on plain http) -----
# DJANGO_HTTPS=1 says every browser reaches the site over https: cookies are sent over https
# only, http is redirected (health probes excepted) and browsers are told to stay on https.
_HTTPS = env_bool("DJANGO_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_SSL_REDIRECT = _HTTPS
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]  # probes inside the network speak http
# A year, subdomains and preload once HTTPS is on (what `check --deploy` asks); shorten the
# seconds for a first rollout. 0 turns HSTS off.
SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31_536_000 if _HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", _HTTPS)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", _HTTPS)
# The header a TLS-terminating proxy sets, e.g. "X-Forwarded-Proto: https". Set it only when
# that proxy always overwrites the header: a client could otherwise claim https itself.
SECURE_PROXY_SSL_HEADER = deployment.proxy_ssl_header(env_str("DJANGO_SECURE_PROXY_SSL_HEADER", ""))
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])
X_FRAME_OPTIONS = "DENY"
# Every page says where its scripts, styles and images may come from (django-csp; Django's own
# arrives in 6.0): this site's static files only, so text a customer or a model wrote cannot
# run as script or load anything. The one inline block, the admin's run styles, carries the
# request's nonce; nothing else is inline.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, NONCE],
        "img-src": [SELF],
        "object-src": [NONE],
        "base-uri": [NONE],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}
# The client's address: REMOTE_ADDR, or behind proxies (a count of hops, or their CIDRs) the
# first X-Forwarded-For hop that is not one of them. Every per-address limit counts by it.
AGENTFLOW_TRUSTED_PROXIES = deployment.trusted_proxies(env_str("AGENTFLOW_TRUSTED_PROXIES", ""))

# --- Admin login ----------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": f"django.contrib.auth.password_validation.{name}"}
    for name in (
        "UserAttributeSimilarityValidator",
        "MinimumLengthValidator",
        "CommonPasswordValidator",
        "NumericPasswordValidator",
    )
]
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out client before the rest
    "django.contrib.auth.backends.ModelBackend",
]
# After AGENTFLOW_ADMIN_LOGIN_ATTEMPTS failed logins from one client address (IPv6: its /64)
# it is refused for AGENTFLOW_ADMIN_LOCKOUT_MINUTES. Counted per address, not per username,
# so nobody can lock an operator out from elsewhere; a successful login clears the count.
AXES_FAILURE_LIMIT = env_int("AGENTFLOW_ADMIN_LOGIN_ATTEMPTS", 5, minimum=1)
AXES_COOLOFF_TIME = timedelta(minutes=env_int("AGENTFLOW_ADMIN_LOCKOUT_MINUTES", 15, minimum=1))
AXES_LOCKOUT_PARAMETERS = ["ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "refunds.proxies.client_key"
AXES_LOCKOUT_TEMPLATE = "admin/locked_out.html"

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)
WHITENOISE_USE_FINDERS = True  # serve straight from static/ so `make run` needs no collectstatic
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"

# --- Database ---------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'agentflow.sqlite3'}")
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=300)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets the web process read while a worker writes; IMMEDIATE takes the write lock at
    # BEGIN so two writers queue on the busy timeout instead of failing mid-transaction.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 30,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
    DATABASES["default"]["CONN_MAX_AGE"] = 0
else:
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "connect_timeout": 5,
            # Server-side prepared statements (Django turns them off by default). Without them
            # Postgres plans every step statement again, which costs more than running it.
            # Behind PgBouncer in transaction mode they need max_prepared_statements (>= 1.21);
            # AGENTFLOW_DB_PREPARED_STATEMENTS=off (below) turns them off for older ones.
            "prepare_threshold": 5,
            # A stuck step must not hold claim locks for ever.
            "options": "-c lock_timeout=5000 -c idle_in_transaction_session_timeout=60000",
        }
    )

# Subject keys in a database of their own (docs/privacy.md, "Backups and restores"), backed up
# apart: a restored backup of the data then stays erased. Unset: beside the data (`check` warns,
# agentflow.W009, with a master key and DEBUG off).
KEYSTORE_DATABASE_URL = env_str("KEYSTORE_DATABASE_URL", "")
if KEYSTORE_DATABASE_URL:
    DATABASES["keystore"] = dj_database_url.parse(
        KEYSTORE_DATABASE_URL, conn_max_age=300, conn_health_checks=True
    )
    if DATABASES["keystore"]["ENGINE"] == "django.db.backends.postgresql":
        DATABASES["keystore"].setdefault("OPTIONS", {})["connect_timeout"] = 5
    AGENTFLOW_KEYSTORE_DATABASE = "keystore"
    DATABASE_ROUTERS = ["agentflow.routers.KeystoreRouter"]

# "auto": on until a pooler loses one (PgBouncer in transaction mode before 1.21), then off for
# the process; "on" / "off" say it up front (agentflow._core.pooler).
AGENTFLOW_DB_PREPARED_STATEMENTS = env_str("AGENTFLOW_DB_PREPARED_STATEMENTS", "auto").lower()
if AGENTFLOW_DB_PREPARED_STATEMENTS == "off":
    DATABASES["default"].get("OPTIONS", {}).pop("prepare_threshold", None)

# --- Celery (read through config_from_object(namespace="CELERY")) ----------------------------
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Default: kombu's filesystem transport (config.broker makes its files atomic), no server.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "agentflowfs://localhost//")
_BROKER_IS_FILESYSTEM = CELERY_BROKER_URL.startswith(("filesystem", "agentflowfs"))
CELERY_RESULT_BACKEND = None  # Postgres is the state of record; a result backend adds failure modes
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True  # only late acks give a message back after a whole-worker crash
CELERY_TASK_REJECT_ON_WORKER_LOST = True  # a killed child's step is redelivered, not acked away
CELERY_WORKER_PREFETCH_MULTIPLIER = 1  # nothing ages in `unacked` waiting behind a long step
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_TASK_TIME_LIMIT = 300
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_CONNECTION_MAX_RETRIES = None  # workers never give up on a restarting broker
# A broker blip must not turn every step in flight into an unknown outcome: the running step
# finishes and commits; the copy of its message the broker gives back on reconnect finds the
# step claimed (live lease and owner) or completed and does nothing. Fences, not cancellation,
# keep the two copies from both acting.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False
CELERY_WORKER_SOFT_SHUTDOWN_TIMEOUT = 20.0  # below compose's stop_grace_period (30 s)
CELERY_WORKER_ENABLE_SOFT_SHUTDOWN_ON_IDLE = True
# Celery >= 5.6 closes DB connections around every task; reusing them saves a connect per step.
# Broken connections are still dropped by close_old_connections() at the start of each step.
CELERY_DB_REUSE_MAX = 1000
# Workers keep Django's LOGGING (below), so their lines are masked like the web's.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
if _BROKER_IS_FILESYSTEM:
    _BROKER_DIR = VAR_DIR / "broker"
    for _sub in ("queue", "control", "processed"):
        (_BROKER_DIR / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {
        "data_folder_in": str(_BROKER_DIR / "queue"),
        "data_folder_out": str(_BROKER_DIR / "queue"),
        "control_folder": str(_BROKER_DIR / "control"),
        "processed_folder": str(_BROKER_DIR / "processed"),
        "store_processed": False,
        "polling_interval": 0.1,
    }
elif CELERY_BROKER_URL.startswith(("amqp", "pyamqp")):
    # A publish returns once RabbitMQ has the message (publisher confirms). Its consumer_timeout
    # (1800 s by default) stays above the step's hard time limit: check agentflow.W005.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"confirm_publish": True}
    # "quorum" for a RabbitMQ cluster (a queue's type is fixed once declared: a new name or vhost).
    CELERY_TASK_DEFAULT_QUEUE_TYPE = env_str("CELERY_TASK_DEFAULT_QUEUE_TYPE", "classic")
else:
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        # Above the hard time limit, so a running step is never handed to a second worker.
        # Lost work is found by the database sweeper long before this matters.
        "visibility_timeout": 1200,
        "unacked_restore_interval": 10,
        "unacked_restore_throttle": 1,
        # One list per priority (docs/operating.md, Priorities), named `celery:<n>` beside
        # `celery` (priority 9, which kombu reads first): kombu's default keeps 4.
        "priority_steps": list(range(10)),
        "sep": ":",
    }
# Step messages carry their run's priority (docs/operating.md, Priorities). RabbitMQ orders them
# only in a queue declared with x-max-priority, and a queue declared before keeps its arguments
# (use a new vhost, or delete the drained queue). Set whatever the broker, so every process
# declares the queue alike; Redis and the filesystem transport ignore queue arguments.
CELERY_TASK_QUEUE_MAX_PRIORITY = 9
# Beat runs the recovery sweeper and retention itself (agentflow.beat), so no sweep ever
# queues behind steps.
CELERY_BEAT_SCHEDULER = "agentflow.beat:Scheduler"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# --- Engine (each has a default in agentflow._conf; this site reads them from the environment) --
AGENTFLOW_LEASE_SECONDS = env_int("AGENTFLOW_LEASE_SECONDS", 10, minimum=1)
# Every second: a whole worker's death is noticed through its freed advisory lock at the next
# sweep, so this is what recovery takes (the query reads only active runs: ~1-6 ms).
AGENTFLOW_SWEEP_INTERVAL = env_int("AGENTFLOW_SWEEP_INTERVAL", 1, minimum=1)
AGENTFLOW_SWEEP_BATCH = env_int("AGENTFLOW_SWEEP_BATCH", 1000, minimum=1)
# A run re-published with no worker answering is rung again after 1, 2, 4 ... leases, up to
# this: a burst queued longer than a lease is not flooded with duplicates (docs/how-it-works.md).
AGENTFLOW_SWEEP_BACKOFF_MAX_SECONDS = env_float(
    "AGENTFLOW_SWEEP_BACKOFF_MAX_SECONDS", 300.0, minimum=1.0
)
AGENTFLOW_MAX_ATTEMPTS = env_int("AGENTFLOW_MAX_ATTEMPTS", 8, minimum=1)
# The demo workflow `make run` starts (config/workflows.py), beside every installed app's.
AGENTFLOW_WORKFLOW_MODULES = ["config.workflows", *env_list("AGENTFLOW_WORKFLOW_MODULES", [])]
# The release this process runs (docs/deploys.md, "Builds"): a git sha or an image tag; empty, a
# digest of the registered workflow definitions. The same in web, worker and beat of one release.
AGENTFLOW_BUILD_ID = env_str("AGENTFLOW_BUILD_ID", "")
AGENTFLOW_HOSTNAME = env_str("AGENTFLOW_HOSTNAME", socket.gethostname())
# Where each worker process holds its liveness lock (docs/protocol.md, "Liveness"); empty: the
# default database; "off": leases alone. Behind PgBouncer in transaction mode, a direct URL to
# Postgres.
AGENTFLOW_LIVENESS_DATABASE_URL = env_str("AGENTFLOW_LIVENESS_DATABASE_URL", "")
# The longest back-off a partner's Retry-After can ask for.
AGENTFLOW_MAX_BACKOFF = env_float("AGENTFLOW_MAX_BACKOFF", 300.0, minimum=1.0)
# How long partners keep idempotency keys unless a step declares its own window (Stripe: 24 h):
# an effect first attempted longer ago is never retried blindly
# (docs/protocol.md, "The key window").
AGENTFLOW_KEY_WINDOW_SECONDS = env_float("AGENTFLOW_KEY_WINDOW_SECONDS", 24 * 3600.0)
# Seconds a call declared requires_approval waits for an operator before it is rejected
# (docs/workflows.md, "Timers, signals and approvals").
AGENTFLOW_APPROVAL_TIMEOUT = env_float("AGENTFLOW_APPROVAL_TIMEOUT", 48 * 3600.0, minimum=1.0)
# Tests only (ignored unless AGENTFLOW_FAULTS=1): this process's clock runs this far ahead.
AGENTFLOW_CLOCK_OFFSET_SECONDS = env_float("AGENTFLOW_CLOCK_OFFSET_SECONDS", 0.0, minimum=None)
# The master keys that wrap each customer's key (docs/privacy.md): "id:key" entries, newest
# first. Unset on the embedded default (or with AGENTFLOW_LOCAL_MASTER_KEY=1, as the suite
# runs), a key made in var/ seals the demo's data too; unset in production, `check` warns.
AGENTFLOW_MASTER_KEYS = env_list("AGENTFLOW_MASTER_KEYS", [])
_LOCAL_KEY = DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3" or env_bool(
    "AGENTFLOW_LOCAL_MASTER_KEY", False
)
if not AGENTFLOW_MASTER_KEYS and _LOCAL_KEY:
    AGENTFLOW_MASTER_KEYS = [keys.local_master_key(VAR_DIR)]
    # The processes this one starts (chaos's workers and beat, with var/ directories of their
    # own) seal and open under the same key: a key of their own opens nothing of this one's.
    os.environ.setdefault("AGENTFLOW_MASTER_KEYS", AGENTFLOW_MASTER_KEYS[0])
if _LOCAL_KEY:
    # A laptop's or the suite's (and their processes'): the key sits in var/ beside the data,
    # so a keystore apart would protect nothing more.
    SILENCED_SYSTEM_CHECKS = ["agentflow.W009"]
#: Finished runs older than this are deleted by the beat task (docs/protocol.md, "Retention"); 0
#: keeps everything.
AGENTFLOW_RETENTION_DAYS = env_int("AGENTFLOW_RETENTION_DAYS", 30)
# Partner limits for the whole fleet (docs/partner-limits.md, "What happens"): JSON such as
# {"stripe": {"rate": "25/s"}}; the engine parses it (check E004 says what is wrong).
AGENTFLOW_PARTNER_LIMITS = env_str("AGENTFLOW_PARTNER_LIMITS", "")
# Schedules kept in settings beside those declared in code (docs/schedules.md): JSON such as
# {"nightly": {"workflow": "reconcile_payments", "cron": "0 2 * * *"}}; the engine parses it.
AGENTFLOW_SCHEDULES = env_str("AGENTFLOW_SCHEDULES", "")
AGENTFLOW_PARTNER_RECOVERY_SECONDS = env_float("AGENTFLOW_PARTNER_RECOVERY_SECONDS", 30.0)
AGENTFLOW_PARTNER_SLOT_SECONDS = env_float("AGENTFLOW_PARTNER_SLOT_SECONDS", 60.0, minimum=1.0)
AGENTFLOW_BREAKER_FAILURES = env_int("AGENTFLOW_BREAKER_FAILURES", 5)
AGENTFLOW_BREAKER_COOLDOWN_SECONDS = env_float(
    "AGENTFLOW_BREAKER_COOLDOWN_SECONDS", 5.0, minimum=0.1
)

# --- Agent mode (docs/agent.md) -------------------------------------------------------------------
# Unset base URL: agent runs use their workflow's scripted planner, so everything works offline.
# Set it to any OpenAI-compatible server (with a model name) to let a real model choose tools.
AGENTFLOW_LLM_BASE_URL = env_str("AGENTFLOW_LLM_BASE_URL", "")
AGENTFLOW_LLM_MODEL = env_str("AGENTFLOW_LLM_MODEL", "")
AGENTFLOW_LLM_API_KEY = env_str("AGENTFLOW_LLM_API_KEY", "")
# Servers tried in order when the one above fails, as JSON: [{"base_url", "model", "api_key"}]
# (the engine parses it; `manage.py check` says what is wrong with a bad one).
AGENTFLOW_LLM_FALLBACKS = env_str("AGENTFLOW_LLM_FALLBACKS", "")
# One request's budget. Below the task's soft time limit (240 s), so a hung server becomes a
# retryable step error under the same step instead of a killed task.
AGENTFLOW_LLM_TIMEOUT_SECONDS = env_int("AGENTFLOW_LLM_TIMEOUT_SECONDS", 60, minimum=1)
# Per run, enforced by code before every new step: a looping model fails the run (and its
# compensations run) instead of spending without end. A refund takes 6 turns and ~5k tokens.
AGENTFLOW_AGENT_MAX_TURNS = env_int("AGENTFLOW_AGENT_MAX_TURNS", 20, minimum=1)
AGENTFLOW_AGENT_MAX_TOKENS = env_int("AGENTFLOW_AGENT_MAX_TOKENS", 100_000, minimum=1)
# Tool calls one run may make (a refund makes 8); a turn may make at most 10 of them. A call
# past either is refused and the model told why: it runs nothing, and nothing undoes it.
AGENTFLOW_AGENT_MAX_TOOL_CALLS = env_int("AGENTFLOW_AGENT_MAX_TOOL_CALLS", 40, minimum=1)
# Dollars one run's model requests may cost (genai-prices' table); unset or 0: no cap. Checked
# before every request against what was spent, what lost answers may have cost (each at its
# worst: max_tokens of output) and what the request could cost: a crash loop cannot pass it.
AGENTFLOW_AGENT_MAX_COST_USD = env_float("AGENTFLOW_AGENT_MAX_COST_USD", 0.0) or None
# The max_tokens each model request is sent with: it bounds what a lost answer may have cost.
AGENTFLOW_LLM_MAX_OUTPUT_TOKENS = env_int("AGENTFLOW_LLM_MAX_OUTPUT_TOKENS", 4096, minimum=1)

# --- Partners and refunds -------------------------------------------------------------------
SANDBOX_URL = env_str("SANDBOX_URL", "http://127.0.0.1:8765")
SANDBOX_SMTP_PORT = env_int("SANDBOX_SMTP_PORT", (urlsplit(SANDBOX_URL).port or 8765) + 1)
# Set explicitly, it wins over `sandbox --port N`'s N + 1 (workers send to this port).
SANDBOX_SMTP_PORT_IS_SET = bool(os.environ.get("SANDBOX_SMTP_PORT", "").strip())
# Days the sandbox airline's today runs ahead of the real date (its bookings and schedule move
# with it): a demo or the suite sees the calendar as it will be, e.g. 365 for a year from now.
SANDBOX_TODAY_OFFSET_DAYS = env_int("SANDBOX_TODAY_OFFSET_DAYS", 0)
STRIPE_API_KEY = env_str("STRIPE_API_KEY", "sk_test_agentflow_sandbox")
# Set (even empty) wins; unset with a real key means real Stripe (test mode); else the sandbox.
STRIPE_API_BASE = os.environ.get(
    "STRIPE_API_BASE", "" if os.environ.get("STRIPE_API_KEY") else SANDBOX_URL
)
# Requests per client address per hour, and per e-mail per hour of those not found to be the
# booking's owner's. 0 turns it off.
REFUNDS_SUBMIT_LIMIT = env_int("REFUNDS_SUBMIT_LIMIT", 5)
# Requests per booking reference per day not found to be its owner's: bounds guessing a
# passenger's name and e-mail for one booking, without locking the owner out (refunds.services).
# 0 turns it off.
REFUNDS_BOOKING_LIMIT = env_int("REFUNDS_BOOKING_LIMIT", 3)
# A verified owner's own requests per booking per day. 0 turns it off.
REFUNDS_OWNER_LIMIT = env_int("REFUNDS_OWNER_LIMIT", 10)
# Which engine handles new refunds: the graph workflow, or the same refund as an agent run.
REFUNDS_ENGINE = env_str("REFUNDS_ENGINE", "graph").strip().lower()
if REFUNDS_ENGINE not in ("graph", "agent"):
    raise ImproperlyConfigured(f"REFUNDS_ENGINE must be graph or agent, got {REFUNDS_ENGINE!r}")
# Where the nightly reconciliation (docs/refunds.md, "Reconciliation") says how each day went.
REFUNDS_FINANCE_EMAIL = env_str("REFUNDS_FINANCE_EMAIL", "finance@agentflow.test")
# The airline's flight notices (refunds.views.airline_notice): the secret it signs them with
# (unset: the endpoint answers 404), where `manage.py sandbox cancel-flight` tells the sandbox
# airline to send them, and who is mailed each cancelled flight's outcome.
REFUNDS_AIRLINE_SECRET = env_str("REFUNDS_AIRLINE_SECRET", "")
REFUNDS_AIRLINE_NOTICES_URL = env_str(
    "REFUNDS_AIRLINE_NOTICES_URL",
    f"http://127.0.0.1:{os.environ.get('AGENTFLOW_WEB_PORT', '8000')}/refunds/airline/notices/",
)
REFUNDS_OPERATIONS_EMAIL = env_str("REFUNDS_OPERATIONS_EMAIL", "operations@agentflow.test")
REFUNDS_PARTNER_MAX_ATTEMPTS = env_int("REFUNDS_PARTNER_MAX_ATTEMPTS", 8, minimum=1)
REFUNDS_PARTNER_RETRY_BASE_SECONDS = env_float("REFUNDS_PARTNER_RETRY_BASE_SECONDS", 1.0)

EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
EMAIL_HOST = env_str("EMAIL_HOST", urlsplit(SANDBOX_URL).hostname or "127.0.0.1")
EMAIL_PORT = env_int("EMAIL_PORT", SANDBOX_SMTP_PORT)
EMAIL_TIMEOUT = 10  # Django's default (None) can block a worker for ever
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "Skyways Rebooking <rebooking@agentflow.test>")

# --- Operations: logs, metrics, traces ---------------------------------------------------------
# json: one JSON object a line, for log shippers (the default: production and compose);
# text: readable lines for a terminal (`make run` sets it).
AGENTFLOW_LOG_FORMAT = env_str("AGENTFLOW_LOG_FORMAT", "json")
# Every handler masks customer e-mail addresses and status-page ids (refunds.redaction).
# gunicorn's access log is routed here too (its lines hold status-page URLs), and Celery keeps
# this configuration instead of installing handlers of its own.
try:
    LOGGING = logs.logging_config(
        format=AGENTFLOW_LOG_FORMAT,
        level=env_str("LOG_LEVEL", "INFO"),
        filters={"redact": {"()": "refunds.redaction.RedactPersonalData"}},
        routed=("gunicorn.access",),
    )
except ValueError as exc:
    raise ImproperlyConfigured(str(exc)) from None
#: Bearer token /metrics requires when set. Unset, /metrics is open only under DEBUG or with
#: AGENTFLOW_METRICS_PUBLIC=1 (scraped over a private network); else it answers 404, since its
#: counters say what the service is doing (a system check warns, agentflow._engine.checks).
AGENTFLOW_METRICS_TOKEN = env_str("AGENTFLOW_METRICS_TOKEN", "")
AGENTFLOW_METRICS_PUBLIC = env_bool("AGENTFLOW_METRICS_PUBLIC", False)
# Counters and histograms from every process (gunicorn workers, Celery's pool children) live in
# one directory of prometheus_client's multiprocess files, which /metrics adds up. Web, worker
# and beat must share it (compose mounts one volume); it must be set before prometheus_client
# is imported, hence here.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(VAR_DIR / "metrics"))
Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]).mkdir(parents=True, exist_ok=True)
#: Traces go to this OTLP/HTTP collector when set; unset, no tracer is installed at all.
OTEL_EXPORTER_OTLP_ENDPOINT = env_str("OTEL_EXPORTER_OTLP_ENDPOINT", "")
