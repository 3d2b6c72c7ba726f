"""A small Django project as a user writes one, for ``benchmarks/drain_project.py``.

What issue 37's second harness ran: ``DBQUEUE = {}`` (every setting at its default, the queues
too), persistent connections for 60 s (``CONN_MAX_AGE = 60``), ``django.contrib.contenttypes``
installed, and one app, ``noop``, whose handler records when it ran. The server comes from
``DATABASE_URL`` (django-environ syntax), the database from ``DRAIN_PROJECT_DATABASE``.

Each difference from ``benchmarks/drain_settings.py`` (the settings of ``drain_command.py``)
can be turned back, one at a time, by ``drain_project.py``'s options, which set these
environment variables for the harness and its worker processes alike:

- ``DRAIN_PROJECT_CONN_MAX_AGE``: seconds, or ``none`` for ``None`` (default ``60``);
- ``DRAIN_PROJECT_CONTENTTYPES``: ``0`` leaves ``django.contrib.contenttypes`` out (default ``1``);
- ``DRAIN_PROJECT_DBQUEUE``: the ``DBQUEUE`` setting as JSON (default ``{}``).
"""

import json
import os

import environ

SECRET_KEY = "django-dbqueue-drain-project-not-a-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = ["django.contrib.contenttypes", "django_dbqueue", "noop"]
if os.environ.get("DRAIN_PROJECT_CONTENTTYPES", "1") == "0":
    INSTALLED_APPS.remove("django.contrib.contenttypes")

_db = environ.Env.db_url_config(
    os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
)
_db["NAME"] = os.environ.get("DRAIN_PROJECT_DATABASE", "dbqueue_bench_drain_project")
_age = os.environ.get("DRAIN_PROJECT_CONN_MAX_AGE", "60")
_db["CONN_MAX_AGE"] = None if _age == "none" else int(_age)
DATABASES = {"default": _db}

DBQUEUE = json.loads(os.environ.get("DRAIN_PROJECT_DBQUEUE", "{}"))
