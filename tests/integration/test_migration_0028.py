"""Migration 0028 (issue 35): the limited claim passes over a limiter row another transaction
holds, and the worker registry admits ``restarting``; migrating back installs 0026's claim and
the registry's old CHECK again."""

import psycopg
import pytest
from django.core.management import call_command

from tests.integration.test_migration_0026 import database

pytestmark = pytest.mark.django_db(transaction=True)

CLAIM_TEXT = """
SELECT pg_catalog.pg_get_functiondef(p.oid) FROM pg_catalog.pg_proc AS p
WHERE p.proname = 'dbqueue_claim_within_limits'
"""
RESTARTING = """
INSERT INTO dbqueue_worker (worker_id, host, pid, version, queues, concurrency, execution, state,
                            started_at, heartbeat_at, stale_at, expires_at, running)
VALUES ('w-restarting', 'h', 1, 'v', '{default}', 1, 'thread', 'restarting', now(), now(), now(),
        now(), 0)
"""


def test_forward_and_back():
    with database("m0028") as (alias, params):
        call_command("migrate", "django_dbqueue", database=alias, verbosity=0)
        with psycopg.connect(**params, autocommit=True) as conn:
            (text,) = conn.execute(CLAIM_TEXT).fetchone()
            assert "FOR UPDATE SKIP LOCKED\n        ) AS x;" in text
            assert "SET search_path TO 'pg_catalog', 'pg_temp'" in text
            conn.execute(RESTARTING)
            conn.execute("DELETE FROM dbqueue_worker")
        call_command("migrate", "django_dbqueue", "0027", database=alias, verbosity=0)
        with psycopg.connect(**params, autocommit=True) as conn:
            (text,) = conn.execute(CLAIM_TEXT).fetchone()
            assert "FOR UPDATE SKIP LOCKED\n        ) AS x;" not in text
            assert "ORDER BY l.scope, l.name\n        FOR UPDATE;" in text
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(RESTARTING)
        call_command("migrate", "django_dbqueue", database=alias, verbosity=0)
        with psycopg.connect(**params, autocommit=True) as conn:
            (text,) = conn.execute(CLAIM_TEXT).fetchone()
            assert "FOR UPDATE SKIP LOCKED\n        ) AS x;" in text
