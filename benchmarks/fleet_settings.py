"""Settings of the worker processes that ``benchmarks/idle_fleet.py`` starts.

The server comes from ``DATABASE_URL`` (django-environ syntax), the database from
``DBQUEUE_BENCH_DATABASE``. Maintenance that would add statements of its own to the count
(sweeps, status lines) is pushed out past the run; the poll interval comes from
``DBQUEUE_BENCH_POLL``.
"""

import os

import environ

SECRET_KEY = "django-dbqueue-bench-not-a-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_dbqueue", "benchmarks.benchapp"]

_db = environ.Env.db_url_config(
    os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
)
_db["NAME"] = os.environ.get("DBQUEUE_BENCH_DATABASE", "dbqueue_bench_fleet")
_db["CONN_MAX_AGE"] = None
DATABASES = {"default": _db}

DBQUEUE = {
    "QUEUES": {"bench": {}},
    "DEFAULT_QUEUE": "bench",
    "POLL_INTERVAL": float(os.environ.get("DBQUEUE_BENCH_POLL", "60")),
    "SWEEP_INTERVAL": 3600.0,
    "STATUS_INTERVAL": 0,
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_dbqueue": {"handlers": ["console"], "level": "INFO"}},
}
