"""What the commands make sure of before they touch the queue's tables."""

from django.core.management.base import CommandError
from django.db import connections

from django_dbqueue.checks import unmigrated
from django_dbqueue.conf import get_settings
from django_dbqueue.connections import DB_ERRORS


def queue_database(*, require_tables=True):
    """The alias of the queue's database, after making sure it is PostgreSQL and (with
    ``require_tables``) migrated; a ``CommandError`` saying what to do otherwise.

    An unreachable database is not an error here: the worker reconnects with backoff, and the
    operator commands fail on it with the driver's own message.
    """
    using = get_settings().DATABASE
    if using not in connections:
        raise CommandError(f"DBQUEUE['DATABASE'] names {using!r}, which is not in DATABASES")
    vendor = connections[using].vendor
    if vendor != "postgresql":
        raise CommandError(
            f"database {using!r} is {vendor}; django-dbqueue needs PostgreSQL "
            "(DBQUEUE['DATABASE'] must name a PostgreSQL database)"
        )
    if require_tables:
        try:
            problem = unmigrated(using)
        except DB_ERRORS:
            problem = None
        if problem:
            raise CommandError(problem)
    return using
