"""Migration 0026 on a database of its own: back to 0025 restores every function as it was, and
forward again hardens them; with the tables in a schema of their own, the functions find them
there whatever their caller's search_path."""

import contextlib
import os

import psycopg
import pytest
from django.core.management import call_command
from django.db import connections

from django_dbqueue.connections import connection_params

pytestmark = pytest.mark.django_db(transaction=True)

# The state of every function of ours: its text, SET clauses, owner and grants.
FUNCTIONS = """
SELECT p.oid::regprocedure::text, pg_get_functiondef(p.oid), p.proconfig, p.proacl::text[]
FROM pg_proc AS p WHERE p.proname LIKE 'dbqueue\\_%%' ORDER BY 1
"""
UNPINNED = {
    "dbqueue_serial_turn",
    "dbqueue_serial_free",
    "dbqueue_limiter_lock",
    "dbqueue_slot_channel",
    "dbqueue_rate_room",
}


@contextlib.contextmanager
def database(suffix, **options):
    """A database alias of a new, empty PostgreSQL database; dropped at the end."""
    name = f"{os.environ.get('DBQUEUE_TEST_DATABASE', 'test_dbqueue')}_{suffix}"
    admin = psycopg.connect(
        **{**connection_params("default"), "dbname": "postgres"}, autocommit=True
    )
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{name}"')
    alias = f"m0026_{suffix}"
    connections.settings[alias] = {
        **connections.settings["default"],
        "NAME": name,
        "OPTIONS": {**connections.settings["default"].get("OPTIONS", {}), **options},
    }
    # connect() directly: the test case lets only "default" through ensure_connection(), and
    # lets an established connection be (as tests/integration/test_bad_input.py's "bare").
    connections[alias].connect()
    try:
        yield alias, {**connection_params("default"), "dbname": name}
    finally:
        with contextlib.suppress(KeyError):
            connections[alias].close()
        with contextlib.suppress(AttributeError, KeyError):
            del connections[alias]
        del connections.settings[alias]
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def functions(params):
    with psycopg.connect(**params) as conn:
        return conn.execute(FUNCTIONS).fetchall()


def test_back_to_0025_restores_every_function_and_forward_hardens_them_again():
    with database("back_and_forth") as (alias, params):
        call_command("migrate", "django_dbqueue", "0025", database=alias, verbosity=0)
        before = functions(params)
        assert len(before) == 27
        call_command("migrate", "django_dbqueue", database=alias, verbosity=0)
        hardened = functions(params)
        # 0026 added four; 0029 moved the three doors to the schema dbqueue and put a wrapper
        # under each old name.
        assert len(hardened) == 34
        for signature, _text, config, _acl in hardened:
            name = signature.split("(")[0]
            if name in UNPINNED:
                assert config is None, signature
            else:
                assert "search_path=pg_catalog, pg_temp" in config, (signature, config)
        call_command("migrate", "django_dbqueue", "0025", database=alias, verbosity=0)
        assert functions(params) == before
        call_command("migrate", "django_dbqueue", database=alias, verbosity=0)
        assert functions(params) == hardened


def test_tables_in_a_schema_of_their_own_are_found_whatever_the_callers_search_path():
    with database("own_schema", options="-c search_path=app") as (alias, params):
        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA app")
        call_command("migrate", "django_dbqueue", database=alias, verbosity=0)
        with psycopg.connect(**params, autocommit=True) as conn:
            # A caller whose search_path does not name app (nor anything else).
            conn.execute("SET search_path = ''")
            job_id = conn.execute(
                "SELECT app.dbqueue_enqueue('noop'::text, '{\"a\": 1}'::jsonb)"
            ).fetchone()[0]
            ids = conn.execute(
                "SELECT app.dbqueue_enqueue_many('[[\"noop\", {}]]'::jsonb)"
            ).fetchone()[0]
            assert (
                conn.execute(
                    "SELECT pg_catalog.count(*) FROM app.dbqueue_job"
                    " WHERE id OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.int8[])",
                    [[job_id, *ids]],
                ).fetchone()[0]
                == 2
            )
            source = conn.execute(
                "SELECT pg_catalog.string_agg(p.prosrc, '') FROM pg_catalog.pg_proc AS p"
                " WHERE p.proname OPERATOR(pg_catalog.~~) 'dbqueue\\_%%'"
            ).fetchone()[0]
            assert "app.dbqueue_job" in source and "public." not in source
