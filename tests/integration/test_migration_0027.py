"""Migration 0027 on a database of its own: rows that break its constraints, written at 0026,
are repaired (the value replaced by the nearest bound, an entry in the job's history naming the
column and its old text, a live job ended), nothing deleted; the constraints are then VALID;
back to 0026 drops them, and forward again adds them."""

import json

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
        "dbqueue_job_lease_bounded",
        *(
            f"dbqueue_job_{c}_range"
            for c in (
                "run_after",
                "created_at",
                "started_at",
                "finished_at",
                "leased_until",
                "cancel_requested_at",
            )
        ),
        "dbqueue_event_published_at_range",
        *(
            f"dbqueue_worker_{c}_range"
            for c in ("started_at", "heartbeat_at", "stale_at", "expires_at")
        ),
        "dbqueue_queue_changed_at_range",
        *(f"dbqueue_schedule_{c}_range" for c in ("last_tick", "last_enqueued", "updated_at")),
        *(
            f"dbqueue_schedule_entry_{c}_range"
            for c in ("last_tick", "last_enqueued", "created_at", "updated_at")
        ),
    ]
)

ROW = """
INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts, max_attempts,
    lease_seconds, errors, created_at, waiting_on, leased_until, worker_id, lease_token,
    started_at, finished_at, cancel_requested_at, result)
VALUES ('noop', 'default', '{}', %(state)s, 0, %(run_after)s, %(attempts)s, 10, %(lease)s,
        '[{"class": "Earlier", "message": "kept"}]', %(created_at)s, %(waiting_on)s,
        %(leased_until)s, %(worker)s, %(token)s, %(started_at)s, %(finished_at)s, %(cancel)s,
        %(result)s)
RETURNING id
"""


def row(conn, **values):
    running = values.get("state") == "running"
    defaults = {
        "state": "pending",
        "run_after": "2030-01-01 00:00:00+00",
        "attempts": 1 if running else 0,
        "lease": 60,
        "created_at": "2026-01-01 00:00:00+00",
        "waiting_on": 0,
        "leased_until": "2030-01-01 00:00:00+00" if running else None,
        "worker": "w1" if running else None,
        "token": 7 if running else None,
        "started_at": None,
        "finished_at": None,
        "cancel": None,
        "result": None,
    }
    return conn.execute(ROW, {**defaults, **values}).fetchone()[0]


def job(conn, job_id):
    state, lease, errors, *times = conn.execute(
        "SELECT state, lease_seconds, errors::text, run_after::text, created_at::text,"
        " leased_until::text, finished_at::text, cancel_requested_at::text, waiting_on"
        " FROM dbqueue_job WHERE id = %s",
        [job_id],
    ).fetchone()
    return state, lease, json.loads(errors), times


def test_the_rows_that_break_the_constraints_are_repaired_and_none_is_lost():
    with database("m0027") as (alias, params):
        call_command("migrate", "django_dbqueue", "0026", database=alias, verbosity=0)
        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute("SET TimeZone = 'UTC'")
            ids = {
                "lease": row(conn, lease="Infinity"),
                "nan": row(conn, lease="NaN"),
                "minus": row(conn, run_after="-infinity"),
                "running": row(conn, state="running", leased_until="infinity"),
                "cancelling": row(
                    conn, state="running", cancel="200000-01-01 00:00:00+00", started_at="now"
                ),
                "waiting": row(conn, state="waiting", waiting_on=1, created_at="4000-01-01 BC"),
                "done": row(
                    conn,
                    state="done",
                    attempts=1,
                    finished_at="10000-01-01 00:00:00+00",
                    result='{"kept": true}',
                ),
                "good": row(conn),
            }
            count = conn.execute("SELECT count(*) FROM dbqueue_job").fetchone()[0]
            # The other tables' times: a schedule entry ticked in year 200000, a worker's
            # heartbeat at -infinity, an event published in 4000 BC, a queue paused at infinity.
            conn.execute(
                "INSERT INTO dbqueue_schedule_entry (name, job_type, cron, timezone, payload,"
                " queue, catch_up, misfire_grace, enabled, last_tick, created_at, updated_at)"
                " VALUES ('far', 'noop', '* * * * *', '', '{}', '', 'latest', 60, true,"
                " '200000-01-01 00:00:00+00', now(), now())"
            )
            conn.execute(
                "INSERT INTO dbqueue_worker (worker_id, host, pid, version, queues, concurrency,"
                " execution, state, started_at, heartbeat_at, stale_at, expires_at, running)"
                " VALUES ('w-far', 'h', 1, 'v', '{default}', 1, 'threads', 'running', now(),"
                " '-infinity', now(), now(), 0)"
            )
            conn.execute(
                "INSERT INTO dbqueue_event (name, payload, subscribers, published_at)"
                " VALUES ('e', '{}', '[]', '4000-01-01 00:00:00+00 BC')"
            )
            conn.execute(
                "INSERT INTO dbqueue_queue (name, paused, changed_at, changed_by)"
                " VALUES ('q', true, 'infinity', 'x')"
            )
        call_command("migrate", "django_dbqueue", "0027", database=alias, verbosity=0)
        with psycopg.connect(**params, autocommit=True) as conn:
            conn.execute("SET TimeZone = 'UTC'")
            assert conn.execute(CONSTRAINTS, [NAMES]).fetchall() == [(name, True) for name in NAMES]
            assert conn.execute("SELECT count(*) FROM dbqueue_job").fetchone()[0] == count
            got = {name: job(conn, job_id) for name, job_id in ids.items()}

            def entry(name):
                state, _, errors, _ = got[name]
                assert errors[0] == {"class": "Earlier", "message": "kept"}  # history kept
                (repaired,) = errors[1:]
                assert repaired["class"] == "UnreadableJob"
                return state, repaired

            for name, column, was, state in [
                ("lease", "lease_seconds", "Infinity", "dead"),
                ("nan", "lease_seconds", "NaN", "dead"),
                ("minus", "run_after", "-infinity", "dead"),
                ("running", "leased_until", "infinity", "dead"),
                ("cancelling", "cancel_requested_at", "200000-01-01 00:00:00+00", "cancelled"),
                ("waiting", "created_at", "4000-01-01 00:00:00+00 BC", "dead"),
                ("done", "finished_at", "10000-01-01 00:00:00+00", "done"),
            ]:
                got_state, repaired = entry(name)
                assert got_state == state, name
                assert (repaired["column"], repaired["was"]) == (column, was), name
                assert repaired["message"].startswith(f"{column}: {was} is not "), name
                live = name != "done"
                assert ("ended the job" in repaired["message"]) is live, name
            assert got["lease"][1] == got["nan"][1] == 86400.0
            assert got["minus"][3][0] == "0001-01-02 00:00:00+00"
            assert got["running"][3][2] is None  # ended: no lease
            assert got["waiting"][3][1] == "0001-01-02 00:00:00+00"
            assert got["waiting"][3][5] == 0
            assert got["done"][3][3] == "9999-12-30 00:00:00+00"
            assert got["good"][:3] == ("pending", 60.0, [{"class": "Earlier", "message": "kept"}])
            assert conn.execute(
                "SELECT (SELECT last_tick::text FROM dbqueue_schedule_entry WHERE name = 'far'),"
                " (SELECT heartbeat_at::text FROM dbqueue_worker WHERE worker_id = 'w-far'),"
                " (SELECT published_at::text FROM dbqueue_event WHERE name = 'e'),"
                " (SELECT changed_at::text FROM dbqueue_queue WHERE name = 'q')"
            ).fetchone() == (
                "9999-12-30 00:00:00+00",
                "0001-01-02 00:00:00+00",
                "0001-01-02 00:00:00+00",
                "9999-12-30 00:00:00+00",
            )
            # The constraints hold from now on.
            with pytest.raises(psycopg.errors.CheckViolation):
                conn.execute(
                    "UPDATE dbqueue_job SET lease_seconds = 'Infinity' WHERE id = %s",
                    [ids["good"]],
                )
        call_command("migrate", "django_dbqueue", "0026", database=alias, verbosity=0)
        with psycopg.connect(**params, autocommit=True) as conn:
            assert conn.execute(CONSTRAINTS, [NAMES]).fetchall() == []
        call_command("migrate", "django_dbqueue", database=alias, verbosity=0)
        with psycopg.connect(**params, autocommit=True) as conn:
            assert conn.execute(CONSTRAINTS, [NAMES]).fetchall() == [(name, True) for name in NAMES]
