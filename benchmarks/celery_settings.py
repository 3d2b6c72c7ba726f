"""Django settings of the processes that ``benchmarks/celery_compare.py`` starts, on both sides.

``DBQUEUE_BENCH_SIDE`` says which: ``ours`` (``run_jobqueue`` and our producers: django_dbqueue
at its defaults, one queue, plus the counted job type of ``benchmarks/celery_jobs.py``) or
``celery`` (the Celery workers and producers, in the benchmark's own venv, where django_dbqueue
is not even installed). Both write their domain rows to the same bench database: the server
from ``DATABASE_URL`` (django-environ syntax), the name from ``DBQUEUE_BENCH_DATABASE``.

The Celery settings are read by ``benchmarks/celery_tasks.py`` the way Celery's Django guide
does (``config_from_object("django.conf:settings", namespace="CELERY")``). They are Celery's
reliable settings: what a team that must not lose a task sets.
"""

import os

import environ

SIDE = os.environ.get("DBQUEUE_BENCH_SIDE", "ours")

SECRET_KEY = "django-dbqueue-bench-not-a-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["benchmarks.benchapp"]
if SIDE == "ours":
    INSTALLED_APPS += ["django_dbqueue", "benchmarks.celery_jobs.CountedJobs"]

_db = environ.Env.db_url_config(
    os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
)
_db["NAME"] = os.environ.get("DBQUEUE_BENCH_DATABASE", "dbqueue_bench_celery")
# Persistent connections, as docs/deployment.md recommends for workers (and most sites run).
_db["CONN_MAX_AGE"] = None
DATABASES = {"default": _db}

# Ours: every DBQUEUE key at its default (drain_settings.py does the same).
DBQUEUE = {"QUEUES": {"default": {}}}

# Celery: the broker the harness names (redis://... or amqp://...).
CELERY_BROKER_URL = os.environ.get("DBQUEUE_BENCH_BROKER", "")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_DEFAULT_QUEUE = "bench"
# Acknowledge a message after the task ran, not when the worker received it: a worker that dies
# mid-task leaves the message to be delivered again (Celery's default acks before the run).
CELERY_TASK_ACKS_LATE = True
# ... and also when the child process running it dies (SIGKILL, the OOM killer): without this,
# Celery acknowledges the message of a task whose process was lost.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
# With late acks, a task whose acknowledgement cannot reach the broker (connection lost) is
# cancelled, since the broker will deliver it again anyway; Celery 6 makes this the default.
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = True
# Messages each worker process reserves: Celery's default multiplier, 4 per child process, as our
# worker runs with its default prefetch. Celery's Optimizing guide advises 1 for long tasks (so
# that a slow task holds no others back) and much larger values (it names 64 and 128) for many
# short tasks when throughput matters: the harness's --celery-prefetch sets it.
CELERY_WORKER_PREFETCH_MULTIPLIER = int(os.environ.get("DBQUEUE_BENCH_PREFETCH", "4"))
# Redis only: how long an unacknowledged message stays with a worker before Redis hands it to
# another. Celery's default, 1 hour, stated: a task whose worker was killed runs again an hour
# later (RabbitMQ redelivers when the consumer's connection closes).
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
# No result backend: the jobs return nothing, and our side stores no result either (a no-op
# handler's result column stays null).
CELERY_TASK_IGNORE_RESULT = True
