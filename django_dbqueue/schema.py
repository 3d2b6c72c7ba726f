"""Whether the queue's tables exist in a database, and the error that says to migrate.

The commands and ``manage.py check`` ask before they start (:func:`unmigrated`). The API does
not ask (a query per ``enqueue()`` would slow its hot path down): a statement of the package
that fails on a missing table, column or function is explained after the fact
(:func:`raise_if_unmigrated`), by asking then.
"""

import functools

from django.db import ProgrammingError, connections

from . import store
from .conf import get_settings
from .connections import OTHER_DB_ERRORS
from .exceptions import NotMigrated

APP = "django_dbqueue"
# SQLSTATEs of a statement that names something the database lacks: undefined table, column,
# function (a database migrated to an older release of the package lacks newer ones).
UNDEFINED = frozenset({"42P01", "42703", "42883"})


def tables():
    """The package's tables, in the order of its models."""
    from django.apps import apps

    models = apps.get_app_config(APP).get_models()
    return list(
        dict.fromkeys(m._meta.db_table for m in models if m._meta.managed and not m._meta.proxy)
    )


def _run_migrate(using):
    return f"Run `python manage.py migrate{'' if using == 'default' else f' --database {using}'}`."


def unmigrated(using, *, after_error=False):
    """A message naming the package's tables missing from database ``using`` and saying to run
    migrate, else ``None``. With ``after_error`` (a statement of the caller's just failed, so a
    transaction open there is aborted) it asks on a connection of its own, and also names the
    package's migrations not applied there (a missing column or function). Queries the
    database: its errors propagate."""
    missing = store.missing_tables(using, tables(), after_error=after_error)
    if missing:
        return (
            f"database {using!r} has no {', '.join(missing)} "
            f"table{'s' if len(missing) > 1 else ''}: django-dbqueue's migrations have not "
            f"been applied there. {_run_migrate(using)}"
        )
    if not after_error:
        return None
    from django.db.migrations.loader import MigrationLoader

    on_disk = sorted(n for a, n in MigrationLoader(None).disk_migrations if a == APP)
    applied = set(store.applied_migrations(using, APP))
    unapplied = [name for name in on_disk if name not in applied]
    if not unapplied:
        return None
    return (
        f"database {using!r} lacks django-dbqueue's migration"
        f"{'s' if len(unapplied) > 1 else ''} {', '.join(unapplied)}: its tables are those of "
        f"an older release. {_run_migrate(using)}"
    )


def raise_if_unmigrated(exc, using, *, aborted=None):
    """Given the ``ProgrammingError`` raised by one of the package's statements on ``using``:
    raise :class:`NotMigrated` instead when the database lacks the package's tables or
    migrations; else return, and the caller re-raises ``exc``. ``aborted``: whether the
    statement ran in the caller's transaction (None: it ran on the thread's connection, so it
    did when a transaction is open there; False for a statement on a connection of its own)."""
    # Django's ProgrammingError wraps the driver's; a side connection's is the driver's own.
    state = getattr(exc, "sqlstate", None) or getattr(exc.__cause__, "sqlstate", None)
    if state not in UNDEFINED:
        return
    if aborted is None:
        aborted = connections[using].in_atomic_block
    try:
        problem = unmigrated(using, after_error=True)
    except OTHER_DB_ERRORS:
        return  # cannot tell: the database's own error stands
    if problem is None:
        return
    if aborted:
        problem += (
            " The failed statement has aborted the transaction open on this connection: leave "
            "the atomic block (it rolls back) before using the connection again."
        )
    raise NotMigrated(f"{problem} Nothing was written.") from exc


def explains_unmigrated(func):
    """Decorate an API function that takes ``using=`` (None: ``DBQUEUE["DATABASE"]``) so that
    its statements failing on a database not migrated raise :class:`NotMigrated`. For the
    functions off the enqueue hot path (an extra call each); ``enqueue()`` has its own ``try``."""

    @functools.wraps(func)
    def explained(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except ProgrammingError as exc:
            using = kwargs.get("using")
            raise_if_unmigrated(exc, get_settings().DATABASE if using is None else using)
            raise

    return explained
