"""Django settings for the django-dbqueue test suite.

The database comes from ``DATABASE_URL`` in django-environ's syntax. For a Unix socket, put the
url-encoded socket directory in the *path*, before the database name (django-environ does not
decode an encoded host): ``postgres://postgres@:5432/%2Fvar%2Frun%2Fpostgresql/postgres``.
``python3 dev.py test`` finds or starts a server and exports its URL.
"""

from __future__ import annotations

import django
import environ

env = environ.Env()

SECRET_KEY = "django-dbqueue-tests-not-a-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]

DATABASES = {
    "default": env.db("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/postgres"),
    # Only for the tests that prove a non-PostgreSQL database is refused; never queried.
    "sqlite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
}
# The database pytest-django creates (and drops). dev.py names it per checkout and Django
# series, so that two checkouts testing against one server don't drop each other's.
# Without DBQUEUE_TEST_DATABASE it is Django's default, "test_" + the database name.
if env.str("DBQUEUE_TEST_DATABASE", default=""):
    DATABASES["default"]["TEST"] = {"NAME": env.str("DBQUEUE_TEST_DATABASE")}
# Workers honour CONN_MAX_AGE between jobs, as Django does between requests: at Django's default
# of 0 every job that touches the database would open a connection of its own. Persistent, as a
# production worker's settings should have them (docs/deployment.md).
DATABASES["default"]["CONN_MAX_AGE"] = None

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_dbqueue",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "tests.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

STATIC_URL = "static/"

USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Tests create users; the slow default hashers only cost time here.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {
        "console": {"class": "logging.StreamHandler"},
    },
    "loggers": {
        # Propagates too, so pytest's caplog still sees the records.
        "django_dbqueue": {"handlers": ["console"], "level": "WARNING"},
    },
}

DBQUEUE = {
    "QUEUES": {
        "default": {},
        "emails": {},
    },
}

if django.VERSION >= (6, 0):
    # Django's Tasks framework runs on the queue; "immediate" is Django's own backend, for the
    # test that proves a task bound to another backend is never run by a worker.
    TASKS = {
        "default": {
            "BACKEND": "django_dbqueue.tasks.DBQueueBackend",
            "QUEUES": ["default", "emails"],
        },
        "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"},
    }
