"""Every timestamp the package's tables hold is one Python reads back (issue 35, migrations 0027
and 0030; DESIGN.md, Trust boundaries: "The database bounds what a row may hold").

The first test is the class's: it lists every timestamp column (and array of timestamps) of
every dbqueue_* table in the migrated database and asserts that each has its range CHECK, so a
table or a column added later without one fails here. The others write, by hand, a time Python
cannot read into each column that migration 0030 bounds, and expect the table to refuse it with
the constraint named.
"""

import pytest
from django.db import IntegrityError, connection

from tests.integration.test_bounded_rows import BAD_TIMES, attempt

pytestmark = pytest.mark.django_db(transaction=True)

# Every timestamp, timestamptz and array of them, of every table whose name starts dbqueue_.
TIME_COLUMNS = r"""
SELECT c.relname, a.attname, t.typcategory = 'A'
FROM pg_catalog.pg_attribute AS a
JOIN pg_catalog.pg_class AS c ON c.oid = a.attrelid
JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
JOIN pg_catalog.pg_type AS t ON t.oid = a.atttypid
WHERE c.relkind IN ('r', 'p') AND c.relname LIKE 'dbqueue\_%'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND a.attnum > 0 AND NOT a.attisdropped
  AND (a.atttypid IN ('timestamptz'::regtype, 'timestamp'::regtype)
       OR t.typelem IN ('timestamptz'::regtype, 'timestamp'::regtype))
ORDER BY 1, 2
"""
# The CHECK constraints of one column: name, validated, the columns it names, its text.
CHECKS = """
SELECT k.conname, k.convalidated,
       ARRAY(SELECT a.attname::text FROM pg_catalog.pg_attribute AS a
             WHERE a.attrelid = k.conrelid AND a.attnum = ANY(k.conkey) ORDER BY 1),
       pg_catalog.pg_get_constraintdef(k.oid)
FROM pg_catalog.pg_constraint AS k
WHERE k.conrelid = %s::regclass AND k.contype = 'c' AND k.conname = %s
"""


def test_every_timestamp_column_of_every_table_has_its_range_check():
    with connection.cursor() as cursor:
        cursor.execute(TIME_COLUMNS)
        columns = cursor.fetchall()
        # The tables 0027 and 0030 bound, at least (so that the query itself cannot go blind).
        tables = {table for table, _c, _a in columns}
        assert {
            "dbqueue_job",
            "dbqueue_limiter",
            "dbqueue_depth",
            "dbqueue_finished",
            "dbqueue_delivery",
            "dbqueue_signal",
            "dbqueue_step",
        } <= tables
        assert ("dbqueue_limiter", "starts", True) in columns
        missing = []
        for table, column, _array in columns:
            name = f"{table}_{column}_range"
            cursor.execute(CHECKS, [table, name])
            found = cursor.fetchall()
            if not found:
                missing.append(name)
                continue
            ((_name, validated, named, text),) = found
            assert validated, name
            assert named == [column], name
            assert "0001-01-02 00:00:00+00" in text and "9999-12-30 00:00:00+00" in text, text
        assert missing == []


# One INSERT per table bounded by 0030, with %(value)s in the column under test and a time in
# bounds in the others.
INSERTS = {
    ("dbqueue_limiter", "starts"): (
        "INSERT INTO dbqueue_limiter (scope, name, part, starts, updated_at)"
        " VALUES ('queue', 'q', '', ARRAY[now(), %(value)s::timestamptz], now())"
    ),
    ("dbqueue_limiter", "updated_at"): (
        "INSERT INTO dbqueue_limiter (scope, name, part, starts, updated_at)"
        " VALUES ('queue', 'q', '', ARRAY[now()], %(value)s)"
    ),
    ("dbqueue_depth", "minute"): (
        "INSERT INTO dbqueue_depth (minute, queue, due, scheduled, running)"
        " VALUES (%(value)s, 'default', 1, 0, 0)"
    ),
    ("dbqueue_finished", "minute"): (
        "INSERT INTO dbqueue_finished (minute, queue, type, done, dead, cancelled,"
        " failed_attempts, wait_histogram) VALUES (%(value)s, 'default', 'noop', 1, 0, 0, 0, '{}')"
    ),
    ("dbqueue_delivery", "created_at"): (
        "INSERT INTO dbqueue_delivery (key, state, attempt, provider_reference, error,"
        " created_at, updated_at) VALUES ('k', 'recorded', 0, '', '', %(value)s, now())"
    ),
    ("dbqueue_delivery", "updated_at"): (
        "INSERT INTO dbqueue_delivery (key, state, attempt, provider_reference, error,"
        " created_at, updated_at) VALUES ('k', 'recorded', 0, '', '', now(), %(value)s)"
    ),
    ("dbqueue_signal", "created_at"): (
        "INSERT INTO dbqueue_signal (job_id, name, seq, payload, created_at)"
        " VALUES (1, 'go', 1, '{}', %(value)s)"
    ),
    ("dbqueue_step", "finished_at"): (
        "INSERT INTO dbqueue_step (job_id, name, occurrence, result, attempt, finished_at)"
        " VALUES (1, 's', 1, '{}', 1, %(value)s)"
    ),
}


@pytest.mark.parametrize("value", BAD_TIMES)
@pytest.mark.parametrize(("table", "column"), list(INSERTS), ids="{0[0]}.{0[1]}".format)
def test_a_time_python_cannot_read_is_refused_by_the_side_tables(table, column, value):
    refused = attempt(INSERTS[table, column], {"value": value})
    assert refused is not None, (table, column, value)
    assert f"{table}_{column}_range" in str(refused)


@pytest.mark.parametrize(("table", "column"), list(INSERTS), ids="{0[0]}.{0[1]}".format)
@pytest.mark.parametrize("value", ["0001-01-02 00:00:00+00", "9999-12-30 00:00:00+00"])
def test_the_bounds_themselves_are_taken(table, column, value):
    assert attempt(INSERTS[table, column], {"value": value}) is None


def test_an_update_to_an_infinite_start_is_refused():
    attempt(INSERTS["dbqueue_limiter", "updated_at"], {"value": "now"})
    with (
        pytest.raises(IntegrityError, match="dbqueue_limiter_starts_range"),
        connection.cursor() as cursor,
    ):
        cursor.execute("UPDATE dbqueue_limiter SET starts = starts || 'infinity'::timestamptz")
