"""The schema the database has: missing tables, applied migrations (asked after a statement
failed, to name the migration to apply)."""

from django.db import connections

from ..connections import connect
from ._db import _execute

# Which of the package's tables the database lacks (never migrated, or migrated elsewhere):
# to_regclass() is NULL for a name that resolves to no relation on the search path.
MISSING_TABLES = """
SELECT name FROM pg_catalog.unnest(%(tables)s::text[]) AS name WHERE to_regclass(name) IS NULL
"""


def missing_tables(using, tables, *, after_error=False):
    """Those of ``tables`` that do not exist in database ``using``. ``after_error``: a statement
    just failed there, so a transaction open on the thread's connection is aborted; ask on a
    connection of its own then."""
    run = _execute_after_error if after_error else _execute
    return [row[0] for row in run(using, MISSING_TABLES, {"tables": list(tables)})]


# Which migrations of an app the database recorded as applied (Django's own table): asked only
# after a statement failed on a missing column or function, to name the migrations to apply.
APPLIED_MIGRATIONS = """
SELECT name FROM django_migrations WHERE app::text = %(app)s::text
"""


def applied_migrations(using, app):
    """The names of ``app``'s migrations recorded as applied in ``using``, asked as
    :func:`missing_tables` asks after an error."""
    return [row[0] for row in _execute_after_error(using, APPLIED_MIGRATIONS, {"app": app})]


# Who, besides its owner, may create objects in the schema of the tables (where the old names of
# the SQL doors are, migration 0029) or in the schema of the doors ("dbqueue"): such a role can
# plant a function or operator that an unqualified call made on the search_path resolves to
# (docs/sql.md, "Privileges"). {schema name: [role, ...]}, 'PUBLIC' for every role.
SCHEMA_WRITERS = """
SELECT n.nspname::pg_catalog.text,
       pg_catalog.array_agg(DISTINCT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid
                                          THEN 'PUBLIC'::pg_catalog.text
                                          ELSE pg_catalog.pg_get_userbyid(a.grantee)::pg_catalog.text
                                     END)
FROM pg_catalog.pg_namespace AS n
CROSS JOIN LATERAL pg_catalog.aclexplode(
    COALESCE(n.nspacl, pg_catalog.acldefault('n'::"char", n.nspowner))) AS a
WHERE (n.oid OPERATOR(pg_catalog.=) (
           SELECT c.relnamespace FROM pg_catalog.pg_class AS c
           WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass('dbqueue_job'::pg_catalog.text))
       OR n.nspname OPERATOR(pg_catalog.=) 'dbqueue'::pg_catalog.name)
  AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'::pg_catalog.text
  AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner
GROUP BY n.nspname
ORDER BY 1
"""


def schema_writers(using):
    """``{schema: [role, ...]}``: the roles other than its owner that may create objects in the
    schema of the tables or of the SQL doors (SCHEMA_WRITERS)."""
    return {name: sorted(roles) for name, roles in _execute(using, SCHEMA_WRITERS, {})}


def _execute_after_error(using, statement, params):
    """Run on ``using`` after a statement failed there: on the thread's Django connection when
    no transaction was open (the failed statement ended its own), else on a connection opened
    for this one question and closed (the caller's transaction is aborted)."""
    if not connections[using].in_atomic_block:
        return _execute(using, statement, params)
    with connect(using) as own:
        return own.execute(statement, params).fetchall()
