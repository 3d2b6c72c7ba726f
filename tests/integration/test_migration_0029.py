"""Migration 0029 on a database of its own: the SQL doors move to the schema dbqueue with their
grants, the old names forward to them, back to 0027 puts everything where it was; a schema
dbqueue that another role owns stops the migration with an error naming it."""

import contextlib
import hashlib

import psycopg
import pytest
from django.core.management import call_command

from tests.integration.test_migration_0026 import FUNCTIONS, database

pytestmark = pytest.mark.django_db(transaction=True)

ENQUEUE = (
    "dbqueue_enqueue(text, jsonb, text, int, timestamptz, interval, int, double precision,"
    " text, text, text, boolean, text)"
)


@contextlib.contextmanager
def role(params, name):
    password = hashlib.sha256(name.encode()).hexdigest()
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute(f"DROP ROLE IF EXISTS {name}")
        admin.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
        try:
            yield {**params, "user": name, "password": password}
        finally:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                [name],
            )
            admin.execute(f"DROP OWNED BY {name} CASCADE")
            admin.execute(f"DROP ROLE {name}")


def test_a_grant_made_before_0029_is_the_grant_of_the_moved_door_and_back_restores_all():
    with database("m0029_grants") as (alias, params):
        call_command("migrate", "django_dbqueue", "0027", database=alias, verbosity=0)
        with role(params, "dbq_m0029_producer") as producer:
            with psycopg.connect(**params, autocommit=True) as admin:
                admin.execute(f"GRANT EXECUTE ON FUNCTION {ENQUEUE} TO dbq_m0029_producer")
                before = admin.execute(FUNCTIONS).fetchall()
            call_command("migrate", "django_dbqueue", "0029", database=alias, verbosity=0)
            with psycopg.connect(**producer, autocommit=True) as conn:
                first = conn.execute("SELECT dbqueue.dbqueue_enqueue('noop', '{}')").fetchone()[0]
                old = conn.execute("SELECT dbqueue_enqueue('noop', '{}')").fetchone()[0]
                assert old > first  # the old name forwards to the door
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute("SELECT dbqueue.dbqueue_enqueue_many('[]')")
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(
                        "CREATE FUNCTION dbqueue.f() RETURNS int LANGUAGE sql AS 'SELECT 1'"
                    )
            call_command("migrate", "django_dbqueue", "0027", database=alias, verbosity=0)
            with psycopg.connect(**params) as conn:
                assert conn.execute(FUNCTIONS).fetchall() == before
                assert conn.execute(
                    "SELECT count(*) FROM pg_namespace WHERE nspname = 'dbqueue'"
                ).fetchone() == (0,)
            with psycopg.connect(**producer, autocommit=True) as conn:
                assert conn.execute("SELECT dbqueue_enqueue('noop', '{}')").fetchone()[0] > old


def test_a_schema_dbqueue_that_another_role_owns_stops_the_migration():
    with database("m0029_taken") as (alias, params):
        call_command("migrate", "django_dbqueue", "0027", database=alias, verbosity=0)
        with role(params, "dbq_m0029_squatter"):
            with psycopg.connect(**params, autocommit=True) as admin:
                admin.execute("CREATE SCHEMA dbqueue AUTHORIZATION dbq_m0029_squatter")
            with pytest.raises(RuntimeError, match="schema 'dbqueue' exists already, owned by"):
                call_command("migrate", "django_dbqueue", database=alias, verbosity=0)
            with psycopg.connect(**params) as conn:  # nothing moved
                assert conn.execute(
                    f"SELECT to_regprocedure('public.{ENQUEUE}') IS NOT NULL"
                ).fetchone() == (True,)
