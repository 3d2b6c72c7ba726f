"""System checks for the ``DBQUEUE`` setting and the registered job types.

Ids are stable and listed in docs/checks.md:

- ``dbqueue.E001`` ``DBQUEUE`` is not a dict.
- ``dbqueue.E002`` an unknown key in ``DBQUEUE`` (the hint names the closest known key).
- ``dbqueue.E003`` a value of the wrong type or out of range.
- ``dbqueue.E004`` a lease (global or a job type's) not longer than ``HEARTBEAT_INTERVAL``.
- ``dbqueue.E005`` the queue database is not PostgreSQL.
- ``dbqueue.E006`` a job type's queue is not in ``QUEUES``.
- ``dbqueue.E007`` a schedule entry names an unregistered job type.
- ``dbqueue.E008`` a schedule entry's cron expression or interval is malformed.
- ``dbqueue.E009`` a ``TASKS`` backend lists a queue that is not in ``QUEUES``.
- ``dbqueue.E010`` a schedule entry is otherwise invalid (unknown key, payload, queue, ...).
- ``dbqueue.E011`` a queue's flow-control option (``global_concurrency``, ``rate_limit``) is
  invalid: not an integer >= 1, a malformed rate limit, a key that is not a payload field name.
- ``dbqueue.E012`` a job type's ``global_concurrency`` or ``rate_limit`` is invalid (a type
  registered without ``@job``, which validates them when it is applied).
- ``dbqueue.E013`` ``SUBSCRIPTIONS`` is malformed or lists a job type that is not registered
  (or has a ``unique_key``, which a subscriber cannot have).
- ``dbqueue.W001`` a lease shorter than two heartbeat intervals: one late heartbeat loses it.
- ``dbqueue.W004`` a fair queue that a fleet-wide limit applies to (its own, or a job type's):
  the limited claim takes its jobs in priority order, not round-robin by key.
- ``dbqueue.W002`` an atomic job type with no timeout, or a long one: its transaction stays open
  for the whole run, holding locks and holding back vacuum.
- ``dbqueue.W003`` the queue's tables do not exist in its database: run ``manage.py migrate``
  (a database check: ``manage.py check --database default``; silent while ``migrate`` or
  ``makemigrations`` runs the checks, and a warning, so that nothing is stopped by it).
- ``dbqueue.W005`` a role other than its owner may create objects in the schema of the tables
  (where the old, unqualified names of the SQL functions are) or in the schema ``dbqueue`` of
  the SQL doors: it can plant a function that an unqualified call resolves to (a database
  check, as W003).
"""

import difflib
import sys

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import connections

from . import registry, schema, store, validation
from .conf import DEFAULTS, QUEUE_OPTIONS, RULES, SETTING_NAME, Settings, bounded, get_settings
from .connections import DB_ERRORS


def _error(id_, msg, hint=None):
    return Error(msg, hint=hint, id=f"dbqueue.{id_}")


# A queue's "concurrency": its share of a worker's handler threads.
_QUEUE_CONCURRENCY = bounded(
    "an integer", minimum=1, integer=True, allow_none=True, maximum=validation.MAX_CONCURRENCY
)


def _check_queues(queues):
    errors = []
    if not isinstance(queues, dict) or not queues:
        return [
            _error(
                "E003",
                f"{SETTING_NAME}['QUEUES'] must be a non-empty dict of queue name -> options, got {queues!r}.",
                hint='For example: {"default": {}, "emails": {"concurrency": 4}}',
            )
        ]
    for name, options in queues.items():
        try:
            validation.queue_name(name, f"{SETTING_NAME}['QUEUES']: a queue name")
        except ValueError as exc:
            errors.append(_error("E003", f"{exc}."))
            continue
        if not isinstance(options, dict):
            errors.append(
                _error(
                    "E003",
                    f"{SETTING_NAME}['QUEUES'][{name!r}] must be a dict of options, got {options!r}.",
                    hint="Use {} for a queue with no options.",
                )
            )
            continue
        for key, value in options.items():
            label = f"{SETTING_NAME}['QUEUES'][{name!r}][{key!r}]"
            if key not in QUEUE_OPTIONS:
                close = difflib.get_close_matches(str(key), QUEUE_OPTIONS, n=1)
                errors.append(
                    _error(
                        "E002",
                        f"{SETTING_NAME}['QUEUES'][{name!r}] has an unknown option {key!r}.",
                        hint=(f"Did you mean {close[0]!r}? " if close else "")
                        + f"Queue options: {', '.join(QUEUE_OPTIONS)}.",
                    )
                )
            elif key == "global_concurrency":
                errors.extend(_flow_error("E011", validation.concurrency_limit, value, label))
            elif key == "rate_limit":
                errors.extend(_flow_error("E011", validation.rate_limit, value, label))
            elif key == "fair":
                if not isinstance(value, bool):
                    errors.append(
                        _error(
                            "E003",
                            f"{label} must be True or False, got {validation.shown(value)}.",
                            hint='For example "tenants": {"fair": True} (docs/fairness.md).',
                        )
                    )
            elif not _QUEUE_CONCURRENCY[0](value):
                errors.append(
                    _error(
                        "E003",
                        f"{SETTING_NAME}['QUEUES'][{name!r}]['concurrency'] must be "
                        f"{_QUEUE_CONCURRENCY[1]}, got {validation.shown(value)}.",
                    )
                )
    return errors


def _flow_error(id_, validator, value, label):
    try:
        validator(value, label)
    except ValueError as exc:
        return [
            _error(
                id_,
                f"{exc}.",
                hint='For example "global_concurrency": 5, or "rate_limit": {"limit": 100, '
                '"period": 60, "key": "account_id"} (docs/concepts/flow-control.md).',
            )
        ]
    return []


def _check_fair_limits(conf):
    """W004: a fleet-wide limit that applies to a fair queue (its own, or any job type's: a
    type's limits apply in every queue) makes its workers claim it through the limited claim,
    which knows no fairness (docs/fairness.md#limits). Another queue's limit does not: a worker
    serving that queue and a fair one says so when it starts (startup.py)."""
    queues = conf.QUEUES if isinstance(conf.QUEUES, dict) else {}
    fair = [n for n, o in queues.items() if isinstance(o, dict) and o.get("fair") is True]
    if not fair:
        return []
    limited = [
        f"queue {n!r} {key}"
        for n in fair
        for key in ("global_concurrency", "rate_limit")
        if queues[n].get(key)
    ]
    limited += [
        f"job type {t.name!r}"
        for t in registry.all_types().values()
        if t.global_concurrency is not None or t.rate_limit is not None
    ]
    if not limited:
        return []
    return [
        Warning(
            f"fair queues {', '.join(map(repr, fair))} are claimed by the limited claim, "
            f"because fleet-wide limits apply to them ({', '.join(limited)}): their jobs "
            "are taken in priority order, not round-robin by fair key.",
            hint="Drop the fair queue's own limit; serve it from processes in which no job type "
            "with a global_concurrency or rate_limit is registered (docs/fairness.md#limits).",
            id="dbqueue.W004",
        )
    ]


def _check_type_flow():
    errors = []
    for t in registry.all_types().values():
        where = f"job type {t.name!r} ({t.location})"
        if t.global_concurrency is not None:
            errors += _flow_error(
                "E012",
                validation.concurrency_limit,
                t.global_concurrency,
                f"{where}: global_concurrency",
            )
        if t.rate_limit is not None:
            errors += _flow_error(
                "E012", validation.rate_limit, t.rate_limit, f"{where}: rate_limit"
            )
    return errors


@register(Tags.compatibility, "dbqueue")
def check_settings(app_configs=None, **kwargs):
    user = getattr(settings, SETTING_NAME, {})
    if user is None:
        user = {}
    if not isinstance(user, dict):
        return [
            _error(
                "E001",
                f"{SETTING_NAME} must be a dict, got {type(user).__name__}.",
                hint=f"{SETTING_NAME} = {{'QUEUES': {{'default': {{}}}}}}",
            )
        ]
    errors = []
    for key in user:
        if key not in DEFAULTS:
            close = difflib.get_close_matches(str(key), DEFAULTS, n=1)
            hint = f"Did you mean {close[0]!r}?" if close else f"Known keys: {', '.join(DEFAULTS)}."
            errors.append(_error("E002", f"{SETTING_NAME} has an unknown key {key!r}.", hint=hint))
    for key, value in user.items():
        if key not in RULES:
            continue
        if key == "QUEUES":
            errors.extend(_check_queues(value))
            continue
        if key == "SUBSCRIPTIONS":
            errors.extend(_check_subscriptions(value))
            continue
        predicate, expected = RULES[key]
        if not predicate(value):
            errors.append(
                _error(
                    "E003",
                    f"{SETTING_NAME}['{key}'] must be {expected}, got {validation.shown(value)}.",
                    hint=f"The default is {DEFAULTS[key]!r}.",
                )
            )
    if errors:
        return errors
    conf = Settings({k: v for k, v in user.items() if k in DEFAULTS})
    errors.extend(_check_leases(conf))
    if conf.BACKOFF_CAP < conf.BACKOFF_BASE:
        errors.append(
            _error(
                "E003",
                f"{SETTING_NAME}['BACKOFF_CAP'] ({conf.BACKOFF_CAP:g}s) is smaller than BACKOFF_BASE "
                f"({conf.BACKOFF_BASE:g}s).",
                hint="The cap is the largest retry delay; make it at least BACKOFF_BASE.",
            )
        )
    if conf.DEFAULT_QUEUE not in conf.QUEUES:
        errors.append(
            _error(
                "E006",
                f"{SETTING_NAME}['DEFAULT_QUEUE'] {conf.DEFAULT_QUEUE!r} is not in QUEUES.",
                hint=f"Add {conf.DEFAULT_QUEUE!r} to {SETTING_NAME}['QUEUES'] or change DEFAULT_QUEUE.",
            )
        )
    for job_type in registry.all_types().values():
        queue = job_type.get_queue(conf)
        if queue not in conf.QUEUES:
            errors.append(
                _error(
                    "E006",
                    f"job type {job_type.name!r} ({job_type.location}) uses queue {queue!r}, which is not in {SETTING_NAME}['QUEUES'].",
                    hint=f"Add {queue!r} to {SETTING_NAME}['QUEUES']; no worker would claim its jobs.",
                )
            )
    errors.extend(_check_atomic_timeouts())
    errors.extend(_check_type_flow())
    errors.extend(_check_fair_limits(conf))
    errors.extend(_check_schedule(conf))
    errors.extend(_check_database(conf))
    return errors


def _check_schedule(conf):
    from .schedule_parser import ScheduleError, parse_entry

    errors = []
    for name, entry in conf.SCHEDULE.items():
        try:
            parse_entry(name, entry, conf)
        except ScheduleError as exc:
            hint = {
                "dbqueue.E007": "Register the type with @job in an app's jobs.py, or fix the name.",
                "dbqueue.E008": "Use a 5-field cron expression ('0 3 * * *') or 'every': seconds.",
            }.get(exc.check_id, "See docs/periodic.md for the entry's keys.")
            errors.append(Error(str(exc), hint=hint, id=exc.check_id))
    return errors


_SUBSCRIPTIONS_HINT = (
    "SUBSCRIPTIONS maps an event name to the job types that each publish() of it makes a job "
    "of, e.g. {'invoice.paid': ['send-receipt', 'update-ledger']} (docs/events.md)."
)


def _check_subscriptions(value):
    def error(message):
        return _error("E013", f"{SETTING_NAME}['SUBSCRIPTIONS'] {message}", _SUBSCRIPTIONS_HINT)

    if not isinstance(value, dict):
        return [error(f"must be a dict, got {validation.shown(value)}.")]
    errors = []
    for event, types in value.items():
        try:
            validation.type_name(event, "has an event name that")
        except ValueError as exc:
            errors.append(error(f"{exc}."))
            continue
        if isinstance(types, str) or not isinstance(types, list | tuple):
            errors.append(
                error(
                    f"[{event!r}] must be a list of job type names, got {validation.shown(types)}."
                )
            )
            continue
        for name in types:
            job_type = registry.get(name) if isinstance(name, str) else None
            if job_type is None:
                known = difflib.get_close_matches(str(name), registry.all_types(), n=1)
                hint = f" Did you mean {known[0]!r}?" if known else ""
                errors.append(
                    error(
                        f"[{event!r}] lists {validation.shown(name)}, which is not "
                        f"a registered job type.{hint}"
                    )
                )
            elif job_type.unique_key is not None:
                errors.append(
                    error(
                        f"[{event!r}] lists {name!r}, which has a unique_key; a "
                        "subscriber's job is keyed by its event instead."
                    )
                )
    return errors


ATOMIC_TIMEOUT_LIMIT = 60.0  # seconds an atomic handler may hold its transaction without W002


def _check_atomic_timeouts():
    warnings = []
    for job_type in registry.all_types().values():
        if job_type.atomic and (
            job_type.timeout is None or job_type.timeout > ATOMIC_TIMEOUT_LIMIT
        ):
            allowed = "no timeout" if job_type.timeout is None else f"timeout={job_type.timeout:g}s"
            warnings.append(
                Warning(
                    f"atomic job type {job_type.name!r} ({job_type.location}) allows {allowed}: its "
                    "transaction stays open for the whole run, holding row locks and holding back "
                    "vacuum on every table.",
                    hint="A timeout does not end the transaction (a thread cannot be stopped; "
                    "it only lets the job be retried elsewhere). Keep the handler short and bound "
                    "its statements (SET LOCAL statement_timeout, lock_timeout), or make it "
                    "non-atomic and idempotent. @job(..., timeout=N) with N <= "
                    f"{ATOMIC_TIMEOUT_LIMIT:g} states the bound and silences this warning.",
                    id="dbqueue.W002",
                )
            )
    return warnings


def _check_leases(conf):
    errors = []
    heartbeat = conf.HEARTBEAT_INTERVAL
    leases = [(f"{SETTING_NAME}['LEASE']", conf.LEASE)]
    leases += [
        (f"job type {t.name!r} lease", t.lease) for t in registry.all_types().values() if t.lease
    ]
    for label, lease in leases:
        if lease <= heartbeat:
            errors.append(
                _error(
                    "E004",
                    f"{label} ({lease:g}s) is not longer than HEARTBEAT_INTERVAL ({heartbeat:g}s): "
                    "every running job would lose its lease between two heartbeats and run twice.",
                    hint="Make the lease at least 3 x HEARTBEAT_INTERVAL.",
                )
            )
        elif lease < 2 * heartbeat:
            errors.append(
                Warning(
                    f"{label} ({lease:g}s) is shorter than two heartbeat intervals ({2 * heartbeat:g}s): "
                    "one late heartbeat (a slow query, a GC pause) loses the lease.",
                    hint="Make the lease at least 3 x HEARTBEAT_INTERVAL.",
                    id="dbqueue.W001",
                )
            )
    return errors


def _check_database(conf):
    if conf.DATABASE not in connections:
        return [
            _error(
                "E005",
                f"{SETTING_NAME}['DATABASE'] names {conf.DATABASE!r}, which is not in DATABASES.",
                hint=f"Use one of: {', '.join(connections)}.",
            )
        ]
    vendor = connections[conf.DATABASE].vendor
    if vendor != "postgresql":
        return [
            _error(
                "E005",
                f"database {conf.DATABASE!r} is {vendor}; django-dbqueue needs PostgreSQL.",
                hint="Point DBQUEUE['DATABASE'] at a PostgreSQL database (15 or newer).",
            )
        ]
    return []


def unmigrated(using):
    """A message saying to run migrate when the queue's tables are missing from ``using``,
    else ``None``. Queries the database (errors connecting to it propagate)."""
    # Every table of the package's models (the worker registry's too: a worker whose heartbeat
    # cannot write its row would log an error at every heartbeat).
    return schema.unmigrated(using)


def _running_migration_command():
    """True while ``migrate`` or ``makemigrations`` (or a command built on them) runs the checks.

    Django gives a check no name of the command that runs it, and ``migrate`` runs the database
    checks exactly as ``check --database default`` does (``databases=[alias]``). So look up the
    call stack for the command object: the checks run inside its ``execute()``.
    """
    from django.core.management.commands.makemigrations import Command as MakeMigrations
    from django.core.management.commands.migrate import Command as Migrate

    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Migrate | MakeMigrations):
            return True
        frame = frame.f_back
    return False


@register(Tags.database, "dbqueue")
def check_migrated(app_configs=None, databases=None, **kwargs):
    """``dbqueue.W003``: the tables are missing. A database check, so it runs only when
    ``check`` is given ``--database`` (on Django 6.1, also ``--tag``); ``run_jobqueue`` and
    ``jobqueue_status`` refuse to start with the same message. ``migrate`` runs the database
    checks before it migrates: telling it to run itself would only confuse, so the check is
    silent there (and in ``makemigrations``)."""
    using = get_settings().DATABASE
    if not databases or using not in databases or using not in connections:
        return []
    if _running_migration_command():
        return []
    if connections[using].vendor != "postgresql":
        return []  # E005 says so
    try:
        message = unmigrated(using)
    except DB_ERRORS:
        return []  # unreachable: not this check's business
    if message is None:
        return []
    return [Warning(message, hint="Run manage.py migrate.", id="dbqueue.W003")]


@register(Tags.database, "dbqueue")
def check_schema_writers(app_configs=None, databases=None, **kwargs):
    """``dbqueue.W005``: roles other than the owner may create objects in the schema of the
    tables or of the SQL doors (docs/sql.md, "Privileges"). A database check, as W003; silent
    when the tables are missing (W003 says so) or the database cannot be asked."""
    using = get_settings().DATABASE
    if not databases or using not in databases or using not in connections:
        return []
    if _running_migration_command() or connections[using].vendor != "postgresql":
        return []
    try:
        if unmigrated(using) is not None:
            return []
        writers = store.schema_writers(using)
    except DB_ERRORS:
        return []
    return [
        Warning(
            f"{', '.join(roles)} may create objects in schema {name!r}, which holds "
            + (
                "django-dbqueue's SQL doors: such a role can plant a function that a call of "
                "dbqueue.dbqueue_enqueue() resolves to, and it runs with the caller's rights."
                if name == "dbqueue"
                else "django-dbqueue's tables and the old, unqualified names of its SQL "
                "functions: such a role can plant a function that an unqualified call "
                "(dbqueue_enqueue(...), or a name in your own SQL) resolves to, and it runs "
                "with the caller's rights."
            ),
            hint=(
                f"REVOKE CREATE ON SCHEMA {name} FROM "
                f"{', '.join(roles)}; and call the SQL functions by their schema: "
                "dbqueue.dbqueue_enqueue(...) (docs/sql.md#privileges)."
            ),
            id="dbqueue.W005",
        )
        for name, roles in writers.items()
    ]
