"""Migration 0030 on a database of its own: rows that break its constraints, written at 0029,
are repaired (a limiter's start out of bounds removed from its window, a dashboard sample of a
minute out of bounds deleted, every other time replaced by the nearest bound), no delivery,
signal or step lost; the constraints are then VALID; back to 0029 drops them, and forward again
adds them."""

import psycopg
import pytest
from django.core.management import call_command

from tests.integration.test_migration_0026 import database

pytestmark = pytest.mark.django_db(transaction=True)

CONSTRAINTS = """
SELECT conname, convalidated FROM pg_constraint WHERE conname = ANY(%s::name[]) ORDER BY 1
"""
NAMES = sorted(
    [
        "dbqueue_limiter_starts_range",
        "dbqueue_limiter_updated_at_range",
        "dbqueue_depth_minute_range",
        "dbqueue_finished_minute_range",
        "dbqueue_delivery_created_at_range",
        "dbqueue_delivery_updated_at_range",
        "dbqueue_signal_created_at_range",
        "dbqueue_step_finished_at_range",
    ]
)
MIN, MAX = "0001-01-02 00:00:00+00", "9999-12-30 00:00:00+00"


def test_the_rows_that_break_the_constraints_are_repaired_and_no_record_is_lost():
    with database("m0030") as (alias, params):
        call_command("migrate", "django_dbqueue", "0029", database=alias, verbosity=0)
        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute("SET TimeZone = 'UTC'")
            conn.execute(
                "INSERT INTO dbqueue_limiter (scope, name, part, starts, updated_at) VALUES"
                " ('queue', 'mixed', '', '{infinity, 2026-01-01 00:00:00+00,"
                " 200000-01-01 00:00:00+00, 2026-01-01 00:00:01+00, -infinity}', 'infinity'),"
                " ('queue', 'shut', '', '{infinity}', '2026-01-01 00:00:00+00'),"
                " ('type', 'fine', '', '{2026-01-01 00:00:00+00}', '2026-01-01 00:00:00+00')"
            )
            conn.execute(
                "INSERT INTO dbqueue_depth (minute, queue, due, scheduled, running) VALUES"
                " ('infinity', 'default', 1, 0, 0),"
                " ('200000-01-01 00:00:00+00', 'default', 2, 0, 0),"
                " ('4000-01-01 00:00:00+00 BC', 'default', 3, 0, 0),"
                " ('2026-01-01 00:00:00+00', 'default', 4, 0, 0)"
            )
            conn.execute(
                "INSERT INTO dbqueue_finished (minute, queue, type, done, dead, cancelled,"
                " failed_attempts, wait_histogram) VALUES"
                " ('-infinity', 'default', 'noop', 1, 0, 0, 0, '{}'),"
                " ('2026-01-01 00:00:00+00', 'default', 'noop', 5, 0, 0, 0, '{}')"
            )
            conn.execute(
                "INSERT INTO dbqueue_delivery (key, state, attempt, provider_reference, error,"
                " created_at, updated_at) VALUES"
                " ('far', 'sent', 2, 'ref-1', '', '-infinity', 'infinity'),"
                " ('near', 'recorded', 0, '', '', '2026-01-01 00:00:00+00',"
                " '2026-01-01 00:00:00+00')"
            )
            conn.execute(
                "INSERT INTO dbqueue_signal (job_id, name, seq, payload, created_at)"
                " VALUES (1, 'go', 1, '{\"kept\": true}', '200000-01-01 00:00:00+00')"
            )
            conn.execute(
                "INSERT INTO dbqueue_step (job_id, name, occurrence, result, attempt, finished_at)"
                " VALUES (1, 's', 1, '{\"kept\": true}', 1, '4000-01-01 00:00:00+00 BC')"
            )
        call_command("migrate", "django_dbqueue", "0030", database=alias, verbosity=0)
        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute("SET TimeZone = 'UTC'")
            assert conn.execute(CONSTRAINTS, [NAMES]).fetchall() == [(name, True) for name in NAMES]
            # The starts out of bounds are gone from their window, the others kept in order.
            assert conn.execute(
                "SELECT name, starts::text, updated_at::text FROM dbqueue_limiter ORDER BY name"
            ).fetchall() == [
                ("fine", '{"2026-01-01 00:00:00+00"}', "2026-01-01 00:00:00+00"),
                (
                    "mixed",
                    '{"2026-01-01 00:00:00+00","2026-01-01 00:00:01+00"}',
                    MAX,
                ),
                ("shut", "{}", "2026-01-01 00:00:00+00"),
            ]
            # The samples of no minute are deleted; the one in bounds kept.
            assert conn.execute("SELECT due FROM dbqueue_depth").fetchall() == [(4,)]
            assert conn.execute("SELECT done FROM dbqueue_finished").fetchall() == [(5,)]
            # The deliveries, the signal and the step are kept, their times clamped.
            assert conn.execute(
                "SELECT key, state, attempt, provider_reference, created_at::text,"
                " updated_at::text FROM dbqueue_delivery ORDER BY key"
            ).fetchall() == [
                ("far", "sent", 2, "ref-1", MIN, MAX),
                ("near", "recorded", 0, "", "2026-01-01 00:00:00+00", "2026-01-01 00:00:00+00"),
            ]
            assert conn.execute(
                "SELECT payload::text, created_at::text FROM dbqueue_signal"
            ).fetchall() == [('{"kept": true}', MAX)]
            assert conn.execute(
                "SELECT result::text, finished_at::text FROM dbqueue_step"
            ).fetchall() == [('{"kept": true}', MIN)]
            # The constraints hold from now on.
            with pytest.raises(psycopg.errors.CheckViolation, match="dbqueue_limiter_starts_range"):
                conn.execute(
                    "UPDATE dbqueue_limiter SET starts = starts || 'infinity'::timestamptz"
                    " WHERE name = 'fine'"
                )
        call_command("migrate", "django_dbqueue", "0029", database=alias, verbosity=0)
        with psycopg.connect(**params, autocommit=True) as conn:
            assert conn.execute(CONSTRAINTS, [NAMES]).fetchall() == []
        call_command("migrate", "django_dbqueue", database=alias, verbosity=0)
        with psycopg.connect(**params, autocommit=True) as conn:
            assert conn.execute(CONSTRAINTS, [NAMES]).fetchall() == [(name, True) for name in NAMES]
