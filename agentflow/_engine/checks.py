"""System checks (`manage.py check`): settings that break the engine's promises or leave
something unreachable, told at deploy time rather than found out from a double charge or an
empty dashboard."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from celery import current_app
from django.core import checks
from django.db import DEFAULT_DB_ALIAS, DatabaseError

from agentflow import _priority, routers
from agentflow import _store as store
from agentflow._conf import DEFAULTS, settings
from agentflow._core import builds, dispatch, registry
from agentflow._engine.tasks import STEP_TIME_LIMIT
from agentflow._limits import rules
from agentflow._observe import metrics
from agentflow._privacy import keys as privacy_keys


@checks.register(checks.Tags.security)
def metrics_access(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """With DEBUG off, /metrics wants AGENTFLOW_METRICS_TOKEN unless it is said to be public."""
    if not metrics.closed():
        return []
    return [
        checks.Warning(
            "/metrics answers 404: DEBUG is off and neither AGENTFLOW_METRICS_TOKEN nor "
            "AGENTFLOW_METRICS_PUBLIC is set.",
            hint="Set AGENTFLOW_METRICS_TOKEN and give the scraper the bearer token, or "
            "AGENTFLOW_METRICS_PUBLIC=1 where only a private network reaches /metrics.",
            id="agentflow.W001",
        )
    ]


@checks.register(checks.Tags.security)
def master_keys(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Personal fields are sealed only with a master key (docs/privacy.md): in production,
    running without one stores them in clear, in every backup."""
    try:
        found = privacy_keys.master_keys()
    except privacy_keys.MasterKeyError as exc:
        return [checks.Error(str(exc), id="agentflow.E011")]
    if found or settings.DEBUG or not any(w.personal for w in registry.definitions()):
        return []  # (with nothing declared personal, there is nothing to seal)
    return [
        checks.Warning(
            "AGENTFLOW_MASTER_KEYS is empty: workflows' personal fields are stored in clear.",
            hint="Set AGENTFLOW_MASTER_KEYS (`manage.py agentflow_rotate_keys --new-key` "
            "makes one) from your secret store; see docs/privacy.md.",
            id="agentflow.W008",
        )
    ]


@checks.register(checks.Tags.security)
def keystore_database(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Subject keys apart from the data they seal (docs/privacy.md, "Backups and restores"):
    a database that exists and is routed to; kept inside the data's, in production, a backup
    of it restored brings back the keys of everyone erased since."""
    alias = routers.keystore_database()
    if alias not in settings.DATABASES:
        return [
            checks.Error(
                f"AGENTFLOW_KEYSTORE_DATABASE is {alias!r}, which DATABASES does not configure.",
                hint="Add that database to DATABASES, or set the alias of one it has.",
                id="agentflow.E012",
            )
        ]
    if routers.keystore_apart() and not any(
        r == routers.ROUTER or isinstance(r, routers.KeystoreRouter)
        for r in settings.DATABASE_ROUTERS
    ):
        return [
            checks.Error(
                f"AGENTFLOW_KEYSTORE_DATABASE is {alias!r} but DATABASE_ROUTERS lacks "
                f"{routers.ROUTER}: migrate would make the subject key table beside the data, "
                "and none where the keys are kept.",
                hint=f"Add {routers.ROUTER!r} to DATABASE_ROUTERS.",
                id="agentflow.E012",
            )
        ]
    try:
        sealing = bool(privacy_keys.master_keys())
    except privacy_keys.MasterKeyError:
        return []  # agentflow.E011 says why
    if settings.DEBUG or not sealing or not _same_database(alias, DEFAULT_DB_ALIAS):
        return []
    return [
        checks.Warning(
            "Subject keys are kept in the database they protect: a restored backup of this "
            "database brings erased keys back.",
            hint="Give the keystore a database of its own, backed up apart "
            f"(AGENTFLOW_KEYSTORE_DATABASE and {routers.ROUTER}); see docs/privacy.md, "
            '"Backups and restores".',
            id="agentflow.W009",
        )
    ]


def _same_database(alias: str, other: str) -> bool:
    """Whether two aliases reach one database (two names for one place keep nothing apart)."""
    if alias == other:
        return True
    where = [settings.DATABASES[a] for a in (alias, other)]
    return len({(d.get("HOST") or "", str(d.get("PORT") or ""), d.get("NAME")) for d in where}) == 1


#: The numeric settings and what each must be: a number above 0 ("positive"), a whole number
#: of at least 1 ("count"), at least 0 ("zero or more"), or any number.
NUMERIC_SETTINGS = {
    "AGENTFLOW_LEASE_SECONDS": "positive",
    "AGENTFLOW_SWEEP_INTERVAL": "positive",
    "AGENTFLOW_SWEEP_BATCH": "count",
    "AGENTFLOW_SWEEP_BACKOFF_MAX_SECONDS": "positive",
    "AGENTFLOW_MAX_ATTEMPTS": "count",
    "AGENTFLOW_MAX_BACKOFF": "positive",
    "AGENTFLOW_KEY_WINDOW_SECONDS": "positive",
    "AGENTFLOW_CLOCK_OFFSET_SECONDS": "any",
    "AGENTFLOW_RETENTION_DAYS": "zero or more",
    "AGENTFLOW_LLM_TIMEOUT_SECONDS": "positive",
    "AGENTFLOW_AGENT_MAX_TURNS": "count",
    "AGENTFLOW_AGENT_MAX_TOKENS": "count",
    "AGENTFLOW_AGENT_MAX_TOOL_CALLS": "count",
    "AGENTFLOW_AGENT_MAX_COST_USD": "positive or unset",
    "AGENTFLOW_LLM_MAX_OUTPUT_TOKENS": "count",
    "AGENTFLOW_APPROVAL_TIMEOUT": "positive",
    "AGENTFLOW_PARTNER_RECOVERY_SECONDS": "zero or more",
    "AGENTFLOW_PARTNER_SLOT_SECONDS": "positive",
    "AGENTFLOW_BREAKER_FAILURES": "zero or more",
    "AGENTFLOW_BREAKER_COOLDOWN_SECONDS": "positive",
}
_MUST_BE = {
    "positive or unset": "a number above 0, or None (no cap)",
    "positive": "a number above 0",
    "count": "a whole number of at least 1",
    "zero or more": "a number of at least 0",
    "any": "a number",
}


def _fits(value: Any, kind: str) -> bool:
    if kind == "positive or unset":
        if value is None:
            return True
        if isinstance(value, Decimal) and value.is_finite():
            value = float(value)
        kind = "positive"
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return False  # True is 1 to Python, never a number of seconds; NaN fits nowhere
    if kind == "positive":
        return value > 0
    if kind == "count":
        return value >= 1 and float(value).is_integer()
    return value >= 0 if kind == "zero or more" else True


@checks.register()
def numeric_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A numeric setting the engine reads when it first needs it (a lease, a back-off, an
    approval's deadline) would otherwise fail a step, or a sweep, with a traceback at that
    moment, on a worker, long after the deploy that set it."""
    messages: list[checks.CheckMessage] = []
    for name, kind in NUMERIC_SETTINGS.items():
        value = getattr(settings, name)
        if not _fits(value, kind):
            default = DEFAULTS[name][0]
            messages.append(
                checks.Error(
                    f"{name} must be {_MUST_BE[kind]}, not {value!r}.",
                    hint=f"The default is {default!r}: {DEFAULTS[name][1]}",
                    id="agentflow.E003",
                )
            )
    return messages


@checks.register()
def partner_limits(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A malformed AGENTFLOW_PARTNER_LIMITS fails at deploy time, not in a step's call."""
    try:
        rules.parse_limits(settings.AGENTFLOW_PARTNER_LIMITS)
    except rules.LimitsError as exc:
        return [
            checks.Error(
                str(exc),
                hint='For example {"stripe": {"rate": "25/s"}, "airline": {"concurrency": 3}}.',
                id="agentflow.E004",
            )
        ]
    return []


@checks.register()
def build_id(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """An AGENTFLOW_BUILD_ID no build column can hold would stop every worker at its start."""
    named = settings.AGENTFLOW_BUILD_ID
    refused = builds.named_problem(named) if named else ""
    if not refused:
        return []
    return [
        checks.Error(
            f"AGENTFLOW_BUILD_ID: {refused}.",
            hint="A release's git sha or image tag; '/', ':', '.', inner spaces and any "
            "script are fine.",
            id="agentflow.E005",
        )
    ]


#: A webhook partner's name: what the URL the docs mount (`hooks/<slug:partner>/`) takes, and
#: no ":", which parts it from the partner's own id in a signal id (`<partner>:<id>`).
_WEBHOOK_PARTNER = re.compile(r"[-a-zA-Z0-9_]{1,100}")


@checks.register()
def webhook_secrets(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A webhook partner no URL reaches, or whose secrets are no secrets, would answer its
    partner's deliveries 404 or 500 from the first one on."""
    configured = settings.AGENTFLOW_WEBHOOK_SECRETS
    if not isinstance(configured, dict):
        problems = [f"is a dict of partner -> secret(s), not {type(configured).__name__}"]
    else:
        problems = []
        for partner, found in configured.items():
            if not isinstance(partner, str) or not _WEBHOOK_PARTNER.fullmatch(partner):
                problems.append(
                    f"partner {partner!r} is no slug of 1-100 letters, digits, '-' or '_' (the "
                    "webhook's URL takes <slug:partner>; its signal ids are '<partner>:<id>')"
                )
            secrets = [found] if isinstance(found, str) else found
            if (
                not isinstance(secrets, list)
                or not secrets
                or not all(isinstance(one, str) and one for one in secrets)
            ):
                problems.append(f"[{partner!r}] is a secret, or a list of them")
    return [
        checks.Error(f"AGENTFLOW_WEBHOOK_SECRETS {problem}.", id="agentflow.E006")
        for problem in problems
    ]


@checks.register(checks.Tags.database)
def durable_claims(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """A claim must reach the disk before its effect is made (only step completions that a
    later flushed commit covers skip the wait: `sql.RELAXED_COMMIT`). A server, database or
    role set to `synchronous_commit = off` takes that wait from every commit, so a server crash
    can forget a claim whose effect was made. Run with `check --database default` (and by
    `migrate`)."""
    if not databases or "default" not in databases:
        return []
    try:
        value = store.server_setting("synchronous_commit")
    except DatabaseError:
        return []  # unreachable: the command that needs it says so
    if value != "off":
        return []
    return [
        checks.Warning(
            "The database commits with synchronous_commit = off: a claim lost in a server "
            "crash after its effect was made would let the effect be made again.",
            hint="Leave synchronous_commit at its default (on) for the role and database the "
            "workers use; agentflow relaxes only the commits that may be lost.",
            id="agentflow.W006",
        )
    ]


#: Brokers that hand an unacked message to another worker after a visibility timeout, and the
#: timeout kombu gives them when none is set.
VISIBILITY_TIMEOUT_DEFAULTS = {"redis": 3600.0, "rediss": 3600.0, "sqs": 1800.0}


@checks.register()
def celery_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """The Celery settings the protocol stands on (docs/protocol.md, "One step, in order"): a step
    message redelivered while its step still runs, a message acked before its step ran, or steps
    waiting unacked behind a long one each break a promise the engine makes."""
    conf = current_app.conf
    found: list[checks.CheckMessage] = []
    annotated = _annotations(conf.task_annotations, dispatch.RUN_STEP_TASK)
    for option, wanted in (("acks_late", True), ("reject_on_worker_lost", True)):
        if option in annotated and annotated[option] != wanted:
            found.append(
                checks.Error(
                    f"task_annotations set {option}={annotated[option]!r} for "
                    f"{dispatch.RUN_STEP_TASK}: a step message must be acked only after its "
                    "step ran, and given back when its worker dies.",
                    hint=f"Remove {option} from the annotations of {dispatch.RUN_STEP_TASK}.",
                    id="agentflow.E002",
                )
            )
    if conf.task_always_eager:
        found.append(
            checks.Warning(
                "task_always_eager is on: steps run inside the caller's transaction, before "
                "it commits, and a crash loses them until the sweeper finds them.",
                hint="Use agentflow.testing.run_to_end in tests instead.",
                id="agentflow.W002",
            )
        )
    scheme = str(conf.broker_url or "").split("://", 1)[0].split("+", 1)[0]
    visibility = (conf.broker_transport_options or {}).get(
        "visibility_timeout", VISIBILITY_TIMEOUT_DEFAULTS.get(scheme)
    )
    limit = annotated.get("time_limit", STEP_TIME_LIMIT)
    if scheme in AMQP_SCHEMES:
        found += _consumer_timeout(conf, limit)
    if visibility is None:
        return found
    if limit is None or float(limit) >= float(visibility):
        found.append(
            checks.Warning(
                f"The step task's time limit ({limit} s) is not below the broker's visibility "
                f"timeout ({visibility} s): a step still running would be handed to a second "
                "worker.",
                hint="Annotate a lower time_limit for the step task, or raise "
                "broker_transport_options' visibility_timeout.",
                id="agentflow.W004",
            )
        )
    elif (prefetch := conf.worker_prefetch_multiplier or 1) * float(limit) >= float(visibility):
        found.append(
            checks.Warning(
                f"worker_prefetch_multiplier {prefetch} times the step time limit ({limit} s) "
                f"reaches the broker's visibility timeout ({visibility} s): a message waiting "
                "behind long steps in a worker's prefetch would be handed to another worker.",
                hint="Set CELERY_WORKER_PREFETCH_MULTIPLIER = 1 (steps are one message each).",
                id="agentflow.W003",
            )
        )
    return found


@checks.register()
def priority_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """A priority the broker cannot honour is a promise nobody keeps: the customer's step
    waits behind the batch it was meant to pass (docs/operating.md, "Priorities")."""
    problem = _priority.problem(settings.AGENTFLOW_DEFAULT_PRIORITY)
    if problem:
        return [
            checks.Error(
                f"AGENTFLOW_DEFAULT_PRIORITY: {problem}.",
                hint="Set it to 0-9, or None (steps of runs without a priority go without one).",
                id="agentflow.E007",
            )
        ]
    wanted = settings.AGENTFLOW_DEFAULT_PRIORITY is not None or any(
        workflow.priority is not None for workflow in registry.definitions()
    )
    if not wanted:
        return []
    return [
        checks.Warning(
            f"A workflow declares a priority, but {problem}.",
            hint="docs/operating.md, Priorities, says what each broker needs and gives.",
            id="agentflow.W007",
        )
        for problem in _priority.config_problems(current_app._get_current_object())
    ]


#: RabbitMQ closes a channel that holds a delivered message unacknowledged this long (its
#: `consumer_timeout`, 30 minutes by default since 3.8.15) and hands all it held to others.
RABBITMQ_CONSUMER_TIMEOUT_SECONDS = 1800.0
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp", "librabbitmq")


def _consumer_timeout(conf: Any, limit: Any) -> list[checks.CheckMessage]:
    """A step message stays unacknowledged while its step runs (acks_late), after waiting in
    the prefetch behind others and, for a short retry, until its countdown: all of it must fit
    in RabbitMQ's consumer timeout (a queue's `x-consumer-timeout` argument, on 3.12+, else
    the server's default), or the broker drops the channel mid-step."""
    timeout = RABBITMQ_CONSUMER_TIMEOUT_SECONDS
    for queue in conf.task_queues or ():
        if getattr(queue, "name", None) == (conf.task_default_queue or "celery"):
            declared = (getattr(queue, "queue_arguments", None) or {}).get("x-consumer-timeout")
            if declared is not None:
                timeout = float(declared) / 1000.0
    prefetch = conf.worker_prefetch_multiplier or 1
    held = None if limit is None else prefetch * float(limit) + dispatch.MAX_COUNTDOWN_SECONDS
    if held is not None and held < timeout:
        return []
    return [
        checks.Warning(
            f"A step message can stay unacknowledged {held or 'without limit'} s (prefetch "
            f"{prefetch} x the step time limit {limit} s + a countdown of up to "
            f"{dispatch.MAX_COUNTDOWN_SECONDS:.0f} s), not below RabbitMQ's consumer timeout "
            f"({timeout:.0f} s): the broker would close the channel mid-step and hand every "
            "message it held to another worker.",
            hint="Lower the step task's time_limit (task_annotations) and keep "
            "CELERY_WORKER_PREFETCH_MULTIPLIER = 1, or raise RabbitMQ's consumer_timeout "
            "(rabbitmq.conf, or the queue's x-consumer-timeout argument on 3.12+).",
            id="agentflow.W005",
        )
    ]


def _annotations(annotations: Any, task: str) -> dict[str, Any]:
    """The options `task_annotations` sets for `task` (a dict by name or "*", or a list)."""
    found: dict[str, Any] = {}
    for entry in annotations if isinstance(annotations, list | tuple) else [annotations]:
        if isinstance(entry, dict):
            found.update(entry.get("*", {}))
            found.update(entry.get(task, {}))
    return found
