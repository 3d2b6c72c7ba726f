"""The PostgreSQL array columns, without ``django.contrib.postgres``.

Each field deconstructs under ``django_dbqueue.models``, the path the migrations were written
with, so moving the class between modules never reads as a schema change.
"""

from django.db import models


class _PackageField(models.Field):
    def deconstruct(self):
        name, _path, args, kwargs = super().deconstruct()
        return name, f"django_dbqueue.models.{type(self).__name__}", args, kwargs


class IdArrayField(_PackageField):
    """A PostgreSQL ``bigint[]`` of job ids, read and written as a list of ints or ``None``.

    Not ``django.contrib.postgres``'s ArrayField, which needs that app in INSTALLED_APPS (a
    system check error on Django 6.1): only the package's SQL reads and writes this column.
    """

    description = "list of job ids (bigint[])"

    def db_type(self, connection):
        return "bigint[]"


class TimestampArrayField(_PackageField):
    """A PostgreSQL ``timestamptz[]``; only the limited claim's SQL reads and writes it."""

    description = "list of timestamps (timestamptz[])"

    def db_type(self, connection):
        return "timestamptz[]"


class TextArrayField(_PackageField):
    """A PostgreSQL ``text[]``, read as a list of strings; only presence.py's SQL writes it."""

    description = "list of strings (text[])"

    def db_type(self, connection):
        return "text[]"
