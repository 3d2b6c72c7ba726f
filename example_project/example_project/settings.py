"""Settings for the django-dbqueue example shop.

Everything that differs between machines comes from the environment (django-environ):
DATABASE_URL, DEBUG, SECRET_KEY, ALLOWED_HOSTS, LOG_LEVEL, SHOP_FAKE_PROVIDER_MODE.
"""

from pathlib import Path

import environ

BASE_DIR = Path(__file__).resolve().parent.parent  # example_project/

env = environ.Env()

DEBUG = env.bool("DEBUG", default=True)
SECRET_KEY = env.str("SECRET_KEY", default="django-insecure-dbqueue-example-dev-only")
# "testserver" lets `manage.py shop_demo` post to the real view through django.test.Client.
ALLOWED_HOSTS = [*env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1"]), "testserver"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_dbqueue",
    "shop",
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

ROOT_URLCONF = "example_project.urls"
WSGI_APPLICATION = "example_project.wsgi.application"

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

DATABASES = {
    # The database `python3 dev.py demo` creates (and keeps unless given --drop).
    "default": env.db("DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/dbqueue_demo"),
}
# The fake payment provider (shop/payments.py) keeps its charges in the same database, but writes
# them on a connection of its own, so that they commit independently of the shop's transactions,
# as a remote provider's do. Nothing else uses this alias; `migrate` only runs on "default".
DATABASES["payment_provider"] = {
    **DATABASES["default"],
    "TEST": {"MIRROR": "default"},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
LANGUAGE_CODE = "en-us"
USE_I18N = True

STATIC_URL = "static/"

# The queue: three queues, all other settings at their defaults.
DBQUEUE = {"QUEUES": {"default": {}, "emails": {}, "payments": {}}}

# How the fake payment provider answers: "ok", "timeout-once" (charges, then the answer is lost)
# or "decline". See shop/payments.py.
SHOP_FAKE_PROVIDER_MODE = env.str("SHOP_FAKE_PROVIDER_MODE", default="ok")

# E-mails are written to files, one file per message, so that the worker process (a separate
# process) and `shop_demo` (which counts them) can both see them.
EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
EMAIL_FILE_PATH = BASE_DIR / "sent_emails"
DEFAULT_FROM_EMAIL = "billing@shop.example"

LOG_LEVEL = env.str("LOG_LEVEL", default="INFO")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "console": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "console"},
    },
    "loggers": {
        "django_dbqueue": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        "shop": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
    },
}
