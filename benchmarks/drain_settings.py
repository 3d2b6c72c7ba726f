"""Settings of the ``run_jobqueue`` process that ``benchmarks/drain_command.py`` starts.

Everything of django-dbqueue at its defaults, as a user deploys it: one queue, ``default``, no
DBQUEUE key but QUEUES. The server comes from ``DATABASE_URL`` (django-environ syntax), the
database from ``DBQUEUE_BENCH_DATABASE``.
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
_db["NAME"] = os.environ.get("DBQUEUE_BENCH_DATABASE", "dbqueue_bench_drain")
# Persistent connections, as docs/deployment.md recommends for workers.
_db["CONN_MAX_AGE"] = None
DATABASES = {"default": _db}

DBQUEUE = {"QUEUES": {"default": {}}}
