"""Settings of benchmarks/soak.py and of the worker processes it starts.

The server comes from ``DATABASE_URL`` (django-environ syntax), the database from
``DBQUEUE_SOAK_DATABASE`` (the soak's own, default ``dbqueue_soak``). Every process of a soak
reads this one module, so every worker applies the same fleet-wide limits. Each worker process
gets ``DBQUEUE_SOAK_WORKER`` (``w<slot>.<start>``), which names its sessions in
``pg_stat_activity``: the soak terminates one worker's backends by that name.

Timings are short so that faults bite within a run of minutes: a 5 s lease, heartbeats and
sweeps four times a second.
"""

import os

import environ

SECRET_KEY = "django-dbqueue-soak-not-a-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_dbqueue", "benchmarks.soakapp"]

_db = environ.Env.db_url_config(
    os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
)
_db["NAME"] = os.environ.get("DBQUEUE_SOAK_DATABASE", "dbqueue_soak")
_db["CONN_MAX_AGE"] = None
_worker = os.environ.get("DBQUEUE_SOAK_WORKER")
if _worker:
    _db.setdefault("OPTIONS", {})["application_name"] = f"soak {_worker}"
DATABASES = {"default": _db}

LEASE = 5.0
SWEEP_INTERVAL = 0.25

DBQUEUE = {
    "QUEUES": {
        "default": {},
        "limited": {"global_concurrency": 2},
        "rated": {"rate_limit": {"limit": 4, "period": 1.0, "key": "acct"}},
        # Served by one worker slot only, with no limited type (benchmarks/soak_fair.py).
        "fair": {"fair": True},
    },
    "LEASE": LEASE,
    "HEARTBEAT_INTERVAL": 0.25,
    "SWEEP_INTERVAL": SWEEP_INTERVAL,
    "POLL_INTERVAL": 0.5,
    "BACKOFF_BASE": 0.1,
    "BACKOFF_CAP": 1.0,
    "SHUTDOWN_GRACE": 2.0,
    "STATUS_INTERVAL": 0,
    # A job of a type no worker registers (the hostile actor's retype, benchmarks/soak_hostile.py)
    # is handed back unspent and due again after this long: short, so it runs soon after its
    # type is put back.
    "UNKNOWN_TYPE_DELAY": 1.0,
    # Nothing is deleted while the checker may still read it.
    "DONE_RETENTION": 7 * 86400,
    "CANCELLED_RETENTION": 7 * 86400,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_dbqueue": {"handlers": ["console"], "level": "WARNING"}},
}
