"""The ``DBQUEUE`` setting: named defaults, read lazily, reset when tests override settings."""

from functools import lru_cache

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

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
}


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
