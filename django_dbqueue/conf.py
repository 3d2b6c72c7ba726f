"""The ``DBQUEUE`` setting: named defaults, read lazily, reset when tests override settings."""

import math
import numbers
from functools import lru_cache

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from . import validation

SETTING_NAME = "DBQUEUE"

# Every key, its default and (in the comment) its unit. docs/settings.md mirrors this table.
DEFAULTS = {
    "DATABASE": "default",  # database alias of the queue tables
    "QUEUES": {"default": {}},  # name -> {"concurrency": int | None}
    "DEFAULT_QUEUE": "default",  # queue of a type that names none
    "CONCURRENCY": 10,  # handler threads per worker process
    "PREFETCH": None,  # jobs claimed ahead of free threads; None = adaptive (see settings.md)
    "POLL_INTERVAL": 2.0,  # seconds between claims when no notification arrives
    "LEASE": 60.0,  # seconds a claim holds a job before the sweeper may take it back
    "HEARTBEAT_INTERVAL": 10.0,  # seconds between lease extensions of running jobs
    "MAX_ATTEMPTS": 10,  # claims before a failing job is dead
    "MAX_SNOOZES": 1000,  # snoozes (Snooze) of one job before a snooze counts as a failure
    "BACKOFF_BASE": 2.0,  # seconds: ceiling of the first retry delay
    "BACKOFF_FACTOR": 2.0,  # growth of the ceiling per attempt
    "BACKOFF_CAP": 3600.0,  # seconds: largest retry delay
    "SWEEP_INTERVAL": 10.0,  # seconds between sweeps in each worker
    "SWEEP_BATCH": 1000,  # rows per sweep statement
    "SHUTDOWN_GRACE": 30.0,  # seconds running handlers get after SIGTERM
    "ACK_INTERVAL": 0.005,  # seconds completions wait to be flushed in one statement
    "ACK_BATCH": 500,  # completions that force a flush
    "NOTIFY_CHANNEL": "dbqueue",  # LISTEN/NOTIFY channel
    "WAKEUP_WINDOW": 0.005,  # seconds: at most one wake-up per queue per process in this window
    "WAKEUP_IF_WAITING": True,  # wake only when a worker waits for it; False: after every enqueue
    "LISTEN": True,  # False for PgBouncer in transaction mode: poll only
    "LISTEN_DATABASE": None,  # alias with a direct connection for LISTEN; None = DATABASE
    "EXECUTION": "thread",  # "thread", or "process": handlers in child processes (hard timeout)
    "HUNG_THREAD_LIMIT": None,  # handler threads stuck past their timeout at once before the
    #                             worker exits for its supervisor to restart; None = concurrency
    "UNKNOWN_TYPE_DELAY": 60.0,  # seconds before a job of a type this worker lacks is retried
    "UNKNOWN_TYPE_GRACE": 3600.0,  # seconds: an older job of an unknown type is dead at once
    "PREPARE": True,  # prepare the worker's hot statements on its own connections
    "ASYNC_COMMIT": True,  # worker claims/completions/heartbeats commit without a WAL flush wait
    "STATUS_INTERVAL": 10.0,  # seconds between the worker's one-line summaries; 0 = never
    "DONE_RETENTION": 86400.0,  # seconds a done job is kept; None = forever
    "CANCELLED_RETENTION": 604800.0,  # seconds a cancelled job is kept; None = forever
    "DEAD_RETENTION": None,  # seconds a dead job is kept; None = until a person acts
    "SCHEDULE": {},  # name -> periodic job entry (docs/periodic.md)
    "SCHEDULE_INTERVAL": 1.0,  # seconds between each worker's scheduler passes
    "METRICS_CACHE": 10.0,  # seconds a process reuses its table gauges between scrapes
    "METRICS_TOKEN": None,  # bearer token that metrics_view accepts instead of a staff login
    "SUBSCRIPTIONS": {},  # event name -> [job type, ...] that publish() makes a job of
}


# A queue's options in QUEUES (flow control: docs/concepts/flow-control.md; "fair": True takes
# its jobs round-robin by their fair key, docs/fairness.md).
QUEUE_OPTIONS = ("concurrency", "global_concurrency", "rate_limit", "fair")

# The fair key enqueue() gives a fair queue's job that has none: those jobs share it, one key of
# the rotation (store/fair.py). A key a caller gives is never empty.
SHARED_FAIR_KEY = ""


# The rule of each key: what the system checks (checks.py) hold a value to, and what code that
# must not fail on a bad value (the wake-up's window) falls back from.


def _number(value, *, minimum=None, exclusive=False, integer=False, allow_none=False, maximum=None):
    if value is None:
        return allow_none
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    if integer and not isinstance(value, int):
        return False
    # An int is compared as it is (math.isfinite() of 10**400 raises OverflowError); inf and NaN
    # pass comparisons and then break interval arithmetic in SQL.
    if not isinstance(value, int) and not math.isfinite(value):
        return False
    if value > (MAX_SETTING if maximum is None else maximum):
        return False
    if minimum is not None:
        return value > minimum if exclusive else value >= minimum
    return True


MAX_SETTING = validation.MAX_SECONDS  # no number of seconds (or count) in DBQUEUE is larger


def bounded(what, *, minimum, exclusive=False, integer=False, allow_none=False, maximum=None):
    """A rule of ``RULES``: ``_number`` with these bounds, and the words that state both."""
    bound = MAX_SETTING if maximum is None else maximum
    words = f"{what} {'>' if exclusive else '>='} {minimum}, at most {bound}"
    if allow_none is True:
        words += ", or None"
    elif allow_none:
        words += f", or None ({allow_none})"
    return (
        lambda v: _number(
            v,
            minimum=minimum,
            exclusive=exclusive,
            integer=integer,
            allow_none=bool(allow_none),
            maximum=bound,
        ),
        words,
    )


def _valid(validator, value, **kwargs):
    try:
        validator(value, "", **kwargs)
    except ValueError:
        return False
    return True


# key -> (predicate, what it must be)
RULES = {
    "DATABASE": (lambda v: isinstance(v, str) and bool(v), "a database alias (str)"),
    "QUEUES": (None, "a dict of queue name -> options dict"),
    "DEFAULT_QUEUE": (
        lambda v: _valid(validation.queue_name, v),
        f"a queue name (a non-empty str of at most {validation.MAX_QUEUE_NAME} characters)",
    ),
    "CONCURRENCY": bounded(
        "an integer", minimum=1, integer=True, maximum=validation.MAX_CONCURRENCY
    ),
    "PREFETCH": bounded("an integer", minimum=0, integer=True, allow_none="adaptive"),
    "POLL_INTERVAL": bounded("a number of seconds", minimum=0, exclusive=True),
    "LEASE": bounded("a number of seconds", minimum=0, exclusive=True, maximum=86400),
    "HEARTBEAT_INTERVAL": bounded("a number of seconds", minimum=0, exclusive=True),
    "MAX_ATTEMPTS": (
        lambda v: _valid(validation.max_attempts, v),
        f"an integer from 1 to {validation.INT32_MAX}",
    ),
    "MAX_SNOOZES": bounded("an integer", minimum=0, integer=True, maximum=2_000_000_000),
    "BACKOFF_BASE": bounded("a number of seconds", minimum=0, exclusive=True),
    "BACKOFF_FACTOR": bounded("a number", minimum=1),
    "BACKOFF_CAP": bounded("a number of seconds", minimum=0, exclusive=True),
    "SWEEP_INTERVAL": bounded("a number of seconds", minimum=0, exclusive=True),
    "SWEEP_BATCH": bounded("an integer", minimum=1, integer=True),
    "SHUTDOWN_GRACE": bounded("a number of seconds", minimum=0),
    "ACK_INTERVAL": bounded("a number of seconds", minimum=0),
    "ACK_BATCH": bounded("an integer", minimum=1, integer=True),
    "NOTIFY_CHANNEL": (
        # PostgreSQL's identifier limit is 63 bytes (NAMEDATALEN - 1), counted in UTF-8.
        lambda v: _valid(validation.name, v, max_length=63) and len(v.encode()) <= 63,
        "a channel name (str of 1 to 63 bytes in UTF-8)",
    ),
    "WAKEUP_WINDOW": bounded("a number of seconds", minimum=0, maximum=60),
    "WAKEUP_IF_WAITING": (lambda v: isinstance(v, bool), "True or False"),
    "LISTEN": (lambda v: isinstance(v, bool), "True or False"),
    "LISTEN_DATABASE": (
        lambda v: v is None or (isinstance(v, str) and v in settings.DATABASES),
        "None or an alias in DATABASES (a direct connection, not through a pooler)",
    ),
    "EXECUTION": (lambda v: v in ("thread", "process"), '"thread" or "process"'),
    "HUNG_THREAD_LIMIT": bounded(
        "an integer", minimum=0, integer=True, allow_none="the concurrency"
    ),
    "UNKNOWN_TYPE_DELAY": bounded("a number of seconds", minimum=0, exclusive=True),
    "UNKNOWN_TYPE_GRACE": bounded("a number of seconds", minimum=0),
    "PREPARE": (lambda v: isinstance(v, bool), "True or False"),
    "ASYNC_COMMIT": (lambda v: isinstance(v, bool), "True or False"),
    "STATUS_INTERVAL": bounded("a number of seconds (0 turns it off)", minimum=0),
    "DONE_RETENTION": bounded("seconds", minimum=0, allow_none="keep"),
    "CANCELLED_RETENTION": bounded("seconds", minimum=0, allow_none="keep"),
    "DEAD_RETENTION": bounded("seconds", minimum=0, allow_none="keep"),
    "SCHEDULE": (lambda v: isinstance(v, dict), "a dict of schedule name -> entry"),
    "SCHEDULE_INTERVAL": bounded("a number of seconds", minimum=0, exclusive=True),
    "METRICS_CACHE": bounded("a number of seconds", minimum=0),
    "METRICS_TOKEN": (
        lambda v: v is None or (isinstance(v, str) and len(v) >= 16),
        "None or a string of at least 16 characters",
    ),
    "SUBSCRIPTIONS": (None, "a dict of event name -> list of job type names"),
}
assert set(RULES) == set(DEFAULTS), "every setting needs a check rule"


def setting_valid(key, value):
    """Whether ``value`` passes the rule of ``DBQUEUE[key]`` that check_settings applies (for
    code that must fall back to the default rather than fail on a bad value)."""
    predicate = RULES[key][0]
    return predicate is None or predicate(value)


class Settings:
    """Attribute access to the merged settings (``get_settings().LEASE``)."""

    def __init__(self, user):
        self.user = dict(user)
        merged = dict(DEFAULTS)
        merged.update(user)
        self._values = merged
        # Plain attributes (read on every enqueue and claim): every key is upper case, so none
        # shadows a method or the two attributes above; a missing one raises AttributeError.
        self.__dict__.update(
            (k, v) for k, v in merged.items() if isinstance(k, str) and k.isupper()
        )

    def __getattr__(self, name):  # a key that is not an upper-case name (checks report it)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def as_dict(self):
        return dict(self._values)


@lru_cache(maxsize=1)
def get_settings():
    """The merged ``DBQUEUE`` settings. Unknown keys and bad values are reported by checks."""
    user = getattr(settings, SETTING_NAME, None) or {}
    if not isinstance(user, dict):
        user = {}
    return Settings({k: v for k, v in user.items() if k in DEFAULTS})


@receiver(setting_changed)
def _reset(*, setting, **kwargs):
    if setting == SETTING_NAME:
        get_settings.cache_clear()
