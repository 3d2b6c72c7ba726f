"""The SQL doors accept exactly what enqueue() accepts (issue 35; migration 0026; docs/sql.md,
"Payloads", "Times" and "Privileges").

What a door sees is a jsonb: PostgreSQL has already read the caller's JSON text into numeric
values, and prints them back without an exponent, with the digits they were given. Python's json
reads a number printed with a fraction as a float, one without as an int. So the rule of the
doors, the one that makes "a row written through SQL is one the Python side reads back
unchanged" true, is: a payload is accepted when enqueue() accepts the value the worker reads from
it and that value writes back the same jsonb. Property tests hold both doors to it, on payloads
generated as Python values (sent to enqueue() as they are, and to SQL as json.dumps() text) and
as JSON texts only SQL can send (1.50, 1e400, 0.1000000000000000055).
"""

import contextlib
import datetime
import json
import sys

import hypothesis
import psycopg
import pytest
from django.db import connection
from hypothesis import given
from hypothesis import strategies as st

from django_dbqueue import enqueue, enqueue_many, payloads, validation
from django_dbqueue.connections import connection_params
from django_dbqueue.exceptions import EnqueueError, PayloadError
from tests.integration.test_enqueue import same
from tests.utils import job_row, scalar

pytestmark = pytest.mark.django_db(transaction=True)


@contextlib.contextmanager
def any_int_digits():
    """Python's int <-> str digit limit lifted, to write (and read) what only SQL can hold."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(limit)


@contextlib.contextmanager
def raw_connection():
    with psycopg.connect(**connection_params("default"), autocommit=True) as conn:
        yield conn


def python_door(value):
    """enqueue("noop", value): the stored payload as text, or None when it is refused."""
    try:
        job = enqueue("noop", value)
    except PayloadError:
        return None
    return scalar("SELECT payload::text FROM dbqueue_job WHERE id = %s", [job.id])


def sql_doors(conn, text):
    """dbqueue_enqueue() and dbqueue_enqueue_many() given the JSON ``text``: each door's stored
    payload as text, or None when it refused it (its own refusal, SQLSTATE 22023, naming the
    payload; or jsonb's, which cannot read the text)."""
    got = []
    for sql, arg in [
        ("SELECT dbqueue_enqueue('noop', %s::jsonb)", text),
        (
            "SELECT (dbqueue_enqueue_many(%s::jsonb))[1]",
            '[{"type": "noop", "payload": ' + text + "}]",
        ),
    ]:
        try:
            job_id = conn.execute(sql, [arg]).fetchone()[0]
        except psycopg.errors.InvalidParameterValue as exc:
            assert "payload" in exc.diag.message_primary, exc.diag.message_primary
            got.append(None)
        except (psycopg.errors.InvalidTextRepresentation, psycopg.errors.UntranslatableCharacter):
            got.append(None)  # not JSON jsonb can hold: NaN, Infinity, \u0000, a lone surrogate
        else:
            got.append(
                conn.execute(
                    "SELECT payload::text FROM dbqueue_job WHERE id = %s", [job_id]
                ).fetchone()[0]
            )
    return got


def as_stored(conn, text):
    """What jsonb holds for ``text`` (as text), or None when it cannot hold it."""
    try:
        return conn.execute("SELECT %s::jsonb::text", [text]).fetchone()[0]
    except (psycopg.errors.InvalidTextRepresentation, psycopg.errors.UntranslatableCharacter):
        return None


def same_jsonb(conn, a, b):
    return conn.execute("SELECT %s::jsonb = %s::jsonb", [a, b]).fetchone()[0]


def what_python_reads(text):
    with any_int_digits():
        return json.loads(text)


def expected_verdict(conn, stored):
    """The rule: enqueue() accepts what the worker reads from the row, and writing that back
    gives the same jsonb. Returns what enqueue() stores for it, or None."""
    read = what_python_reads(stored)
    try:
        written = payloads.dumps(read)
    except PayloadError:
        return None
    return written if same_jsonb(conn, written, stored) else None


# -- generated payloads ---------------------------------------------------------------------------

keys = st.text(max_size=8)  # NUL and lone surrogates included: jsonb refuses them, as enqueue()
storable = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
near_int_limit = st.integers(10**4299 - 2, 10**4300 + 2) | st.integers(
    -(10**4300) - 2, -(10**4299) + 2
)
edge_floats = st.sampled_from(
    [1e16, -1e16, 9999999999999998.0, 2.0**53, 2.0**53 + 2, 1e15 + 0.5, 5e-324, -0.0, 0.0, 0.1]
)
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | near_int_limit
    | edge_floats
    | st.floats()
    | storable
    | st.text(max_size=4)
)
values = st.recursive(
    leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=12,
)


def nested(depth):
    """A list ``depth`` levels deep (the payload around it is one more)."""
    value = []
    for _ in range(depth - 1):
        value = [value]
    return value


# Every JSON value enqueue() takes as a payload, not objects only: a list, a string, a number,
# a boolean, None (the empty object to both doors), each nested to the limit too.
payloads_strategy = (
    st.dictionaries(
        keys, values | st.integers(96, 104).map(nested) | st.just({}) | st.just([]), max_size=4
    )
    | values
    | st.integers(98, 102).map(nested)
)


@hypothesis.settings(max_examples=100, deadline=None)
@hypothesis.example({"a": 10**4300 - 1})
@hypothesis.example({"a": 10**4300})
@hypothesis.example({"a": nested(99)})
@hypothesis.example({"a": nested(100)})
@hypothesis.example({"a": 1e16})
@hypothesis.example({"a": -0.0})
@hypothesis.example({"a": 9999999999999998.0})
@hypothesis.example([1, "x"])
@hypothesis.example(nested(100))
@hypothesis.example(nested(101))
@hypothesis.example(10**4300)
@hypothesis.example(0.1)
@hypothesis.example("text")
@hypothesis.example(None)
@given(payloads_strategy)
def test_both_doors_give_one_verdict_and_one_row_for_a_python_value(value):
    with any_int_digits():
        text = json.dumps(value)
    try:
        with raw_connection() as conn:
            stored = as_stored(conn, text)
            python = python_door(value)
            sql, many = sql_doors(conn, text)
            assert sql == many  # the two SQL doors agree, row and verdict
            if stored is None:  # jsonb cannot hold it (NaN, inf, NUL, lone surrogate)
                assert python is None and sql is None
                return
            if same(what_python_reads(stored), value):
                # jsonb holds the very value: one verdict, one row.
                assert (python is None) == (sql is None), (python, sql)
                if python is not None:
                    assert same_jsonb(conn, python, sql) and python == sql
            else:
                # jsonb read the text as another number before the door saw it (a float of 1e16
                # or more as an integer, -0.0 as 0.0), which enqueue() refuses for just that
                # reason; the SQL door judges what the worker will read, as enqueue() does.
                assert python is None
                expected = expected_verdict(conn, stored)
                assert (sql is None) == (expected is None), (stored[:200], sql, expected)
                if sql is not None:
                    assert same_jsonb(conn, sql, expected)
            if sql is not None:  # what the worker reads comes back unchanged
                assert same_jsonb(conn, payloads.dumps(what_python_reads(sql)), sql)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM dbqueue_job")


# JSON number texts, as another language may write them: any digits, fraction, exponent.
number_texts = st.builds(
    lambda sign, whole, fraction, exponent: (
        sign + whole + ("." + fraction if fraction else "") + (f"e{exponent}" if exponent else "")
    ),
    st.sampled_from(["", "-"]),
    st.from_regex(r"0|[1-9][0-9]{0,24}", fullmatch=True)
    | st.sampled_from(["9" * 4300, "1" + "0" * 4300, "9007199254740993", "12345678901234567"]),
    st.from_regex(r"[0-9]{0,22}", fullmatch=True),
    st.none() | st.integers(-330, 330) | st.sampled_from([-400, 400, 4299, 4300]),
)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.example(["1.50"])
@hypothesis.example(["1e400"])
@hypothesis.example(["1e4300"])
@hypothesis.example(["0.1000000000000000055"])
@hypothesis.example(["0.1"])
@hypothesis.example(["-0.0"])
@hypothesis.example(["5e-324"])
@hypothesis.example(["3e-324"])
@hypothesis.example(["1e-400"])
@hypothesis.example(["9007199254740993.0"])
@hypothesis.example(["9999999999999999.5"])
@given(st.lists(number_texts, min_size=1, max_size=3))
def test_a_number_text_only_sql_can_send_is_taken_when_python_reads_it_back_unchanged(numbers):
    text = '{"n": [' + ", ".join(numbers) + "]}"
    try:
        with raw_connection() as conn:
            stored = as_stored(conn, text)
            hypothesis.assume(stored is not None)  # past numeric's own range
            sql, many = sql_doors(conn, text)
            assert sql == many
            expected = expected_verdict(conn, stored)
            assert (sql is None) == (expected is None), (stored[:200], sql, expected)
            if sql is not None:
                assert sql == stored  # kept as given: 1.50 stays 1.50, the same number as 1.5
                assert same_jsonb(conn, expected, sql)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM dbqueue_job")


# -- the examples the issue names -----------------------------------------------------------------


def refusal(conn, sql, params=()):
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        conn.execute(sql, params)
    return caught.value.diag


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            '{"a": ' + "9" * 5000 + "}",
            'payload["a"] is an integer of 5000 digits; at most 4300 digits',
        ),
        (
            '{"a": ' + "[" * 1500 + "]" * 1500 + "}",
            'payload["a"][0]... is nested more than 100 levels deep',
        ),
        (
            '{"a": {"b": [1, 0.1000000000000000055]}}',
            'payload["a"]["b"][1] is \'0.1000000000000000055\', which Python reads as the '
            "float 0.1, a different number",
        ),
        (
            '{"a": 12345678901234567.5}',
            "payload[\"a\"] is '12345678901234567.5', which Python reads as a float of "
            "magnitude 1e16 or more",
        ),
        ('{"a": 1e-400}', 'payload["a"] is \'0.0000000'),
    ],
)
def test_a_payload_the_worker_would_read_back_changed_is_refused_naming_its_path(payload, message):
    with raw_connection() as conn:
        diag = refusal(conn, "SELECT dbqueue_enqueue('noop', %s::jsonb)", [payload])
        assert diag.message_primary.startswith("dbqueue_enqueue: " + message), diag.message_primary
        assert "Python's json" in diag.message_hint
        many = refusal(
            conn,
            "SELECT dbqueue_enqueue_many(%s::jsonb)",
            ['[{"type": "noop"}, {"type": "noop", "payload": ' + payload + "}]"],
        )
        assert many.message_primary.startswith("dbqueue_enqueue_many: jobs[1]: " + message)
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0


@pytest.mark.parametrize(
    ("given_text", "python_reads"),
    [
        ("1.50", 1.5),  # the same number; the row keeps the digits it was given
        ("1e400", 10**400),  # an integer to jsonb, and to Python
        ("1" + "0" * 4299, 10**4299),  # 4300 digits: Python's int() reads them
        ("0.1", 0.1),
        ("-0.0", 0.0),  # numeric has no negative zero: it is 0.0 in the row already
        ("1e16", 10**16),  # an integer: the float Python would have written is refused
        ("9999999999999998.0", 9999999999999998.0),
        ("5e-324", 5e-324),
    ],
)
def test_a_number_python_reads_back_unchanged_is_taken(given_text, python_reads):
    with raw_connection() as conn:
        job_id = conn.execute(
            "SELECT dbqueue_enqueue('noop', %s::jsonb)", ['{"n": ' + given_text + "}"]
        ).fetchone()[0]
        stored = conn.execute(
            "SELECT payload::text FROM dbqueue_job WHERE id = %s", [job_id]
        ).fetchone()[0]
    read = what_python_reads(stored)["n"]
    assert same(read, python_reads)
    with raw_connection() as conn:
        assert same_jsonb(conn, payloads.dumps({"n": read}), stored)


# -- times ----------------------------------------------------------------------------------------

MICRO = datetime.timedelta(microseconds=1)


def test_run_after_bounds_are_validations_timestamp_min_and_max():
    with raw_connection() as conn:
        for at in (validation.TIMESTAMP_MIN, validation.TIMESTAMP_MAX):
            conn.execute("SELECT dbqueue_enqueue('noop', run_after => %s)", [at])
            conn.execute(
                "SELECT dbqueue_enqueue_many(%s::jsonb)",
                [json.dumps([{"type": "noop", "run_after": at.isoformat()}])],
            )
        for at in (validation.TIMESTAMP_MIN - MICRO, validation.TIMESTAMP_MAX + MICRO):
            diag = refusal(conn, "SELECT dbqueue_enqueue('noop', run_after => %s)", [at])
            assert diag.message_primary.startswith(
                "dbqueue_enqueue: run_after must be from 0001-01-02 00:00:00+00 to "
                "9999-12-30 00:00:00+00"
            ), diag.message_primary
            diag = refusal(
                conn,
                "SELECT dbqueue_enqueue_many(%s::jsonb)",
                [json.dumps([{"type": "noop", "run_after": at.isoformat()}])],
            )
            assert diag.message_primary.startswith(
                "dbqueue_enqueue_many: jobs[0]: run_after must be from 0001-01-02"
            ), diag.message_primary
    rows = [r[0] for r in _run_afters()]
    assert rows == sorted([validation.TIMESTAMP_MIN] * 2 + [validation.TIMESTAMP_MAX] * 2)


def _run_afters():
    with connection.cursor() as cursor:
        cursor.execute("SELECT run_after FROM dbqueue_job ORDER BY run_after")
        return cursor.fetchall()


@pytest.mark.parametrize("text", ["200000-01-01", "4000-01-01 BC", "infinity", "-infinity"])
def test_a_run_after_python_cannot_hold_is_refused(text):
    with raw_connection() as conn:
        diag = refusal(conn, "SELECT dbqueue_enqueue('noop', run_after => %s::timestamptz)", [text])
        assert "run_after must be" in diag.message_primary
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0


@pytest.mark.parametrize(
    "text",
    [
        "tomorrow",
        "epoch",
        "now",
        "today",
        "allballs",
        "2030-01-31T12:00:00",  # no offset: the session's TimeZone would decide
        "2030-01-31",
        "2030-01-31 12:00",
        "31/01/2030 12:00:00+00",
        "200000-01-01T00:00:00+00:00",
        "2030-02-30T00:00:00+00:00",
        "2030-01-31T12:00:00+00:00 BC",
    ],
)
def test_enqueue_many_takes_iso_8601_with_an_offset_and_nothing_else(text):
    jobs = [{"type": "noop"}, {"type": "noop", "run_after": text}]
    with raw_connection() as conn:
        diag = refusal(conn, "SELECT dbqueue_enqueue_many(%s::jsonb)", [json.dumps(jobs)])
    assert diag.message_primary == (
        "dbqueue_enqueue_many: jobs[1]: run_after must be a timestamp with a UTC offset, in "
        f"ISO 8601 (2030-01-31T12:00:00+00:00), got '{text}'"
    )
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ("2030-01-31T12:00:00+00:00", datetime.datetime(2030, 1, 31, 12, tzinfo=datetime.UTC)),
        ("2030-01-31T12:00Z", datetime.datetime(2030, 1, 31, 12, tzinfo=datetime.UTC)),
        (
            "2030-01-31 12:00:00.25-05:30",
            datetime.datetime(2030, 1, 31, 17, 30, 0, 250000, tzinfo=datetime.UTC),
        ),
        ("2030-01-31T12:00:00+0100", datetime.datetime(2030, 1, 31, 11, tzinfo=datetime.UTC)),
    ],
)
def test_enqueue_many_reads_an_iso_8601_time_with_its_offset(text, at):
    with raw_connection() as conn:
        conn.execute("SET TimeZone = 'America/Los_Angeles'")
        (job_id,) = conn.execute(
            "SELECT (dbqueue_enqueue_many(%s::jsonb))[1]",
            [json.dumps([{"type": "noop", "run_after": text}])],
        ).fetchone()
    assert job_row(job_id)["run_after"] == at


def test_lease_and_delay_past_a_doubles_range_are_refused_by_name():
    with raw_connection() as conn:
        for key, value in [
            ("lease_seconds", "1e400"),
            ("lease_seconds", "1e-400"),
            ("delay", "1e400"),
        ]:
            diag = refusal(
                conn,
                "SELECT dbqueue_enqueue_many(%s::jsonb)",
                [f'[{{"type": "noop", "{key}": {value}}}]'],
            )
            assert diag.message_primary.startswith(f"dbqueue_enqueue_many: jobs[0]: {key} must be")


@pytest.mark.parametrize("offset", ["+16:00", "-16:00", "+23:59", "+9900"])
def test_enqueue_many_refuses_an_offset_postgresql_cannot_read_by_name(offset):
    """Migration 0029: an offset past PostgreSQL's +-15:59 passes the ISO shape; it is the
    function's refusal (22023, the item named), not PostgreSQL's 22009 naming nothing."""
    jobs = [{"type": "noop"}, {"type": "noop", "run_after": f"2030-01-01T00:00:00{offset}"}]
    with raw_connection() as conn:
        diag = refusal(conn, "SELECT dbqueue_enqueue_many(%s::jsonb)", [json.dumps(jobs)])
    assert diag.message_primary == (
        "dbqueue_enqueue_many: jobs[1]: run_after must have a UTC offset from -15:59 to +15:59 "
        f"(what PostgreSQL reads), got '2030-01-01T00:00:00{offset}'"
    )
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0


@pytest.mark.parametrize(
    "key",
    ["dbqueue:event:1:email", "dbqueue-schedule:hourly:2030-01-01T00:00:00+00:00", "dbqueue-"],
)
def test_every_door_refuses_the_packages_own_idempotency_keys(key):
    """Migration 0029 and validation.producer_key(): a key of the package's own jobs (events,
    schedules) is refused at every producer door, worded alike."""
    reason = "reserved for the keys of the package's own jobs (an event's subscribers, a schedule's"
    with raw_connection() as conn:
        diag = refusal(conn, "SELECT dbqueue_enqueue('noop', idempotency_key => %s)", [key])
        assert diag.message_primary.startswith(f"dbqueue_enqueue: idempotency_key '{key}'")
        assert reason in diag.message_primary
        diag = refusal(
            conn,
            "SELECT dbqueue_enqueue_many(jsonb_build_array(jsonb_build_object("
            "'type', 'noop', 'idempotency_key', %s::text)))",
            [key],
        )
        assert diag.message_primary.startswith(
            f"dbqueue_enqueue_many: jobs[0]: idempotency_key '{key}'"
        )
    with pytest.raises(EnqueueError) as caught:
        enqueue("noop", idempotency_key=key)
    assert str(caught.value).startswith(f"idempotency_key '{key}' starts with")
    assert reason in str(caught.value)
    with pytest.raises(EnqueueError, match="reserved"):
        enqueue_many([{"type": "noop", "idempotency_key": key}])
    assert scalar("SELECT count(*) FROM dbqueue_job") == 0
    # Other keys that merely mention the package are a producer's own.
    for mine in ["dbqueue", "DBQUEUE:event:1:x", "my-dbqueue:1", "dbqueue_x"]:
        assert enqueue("noop", idempotency_key=mine).created


def _temp_bytes(conn):
    """The database's temp_bytes, once ``conn`` reported its statistics."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")
    with raw_connection() as other:
        return other.execute(
            "SELECT temp_bytes FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()[0]


@pytest.mark.parametrize(
    ("depth", "tail", "message"),
    [
        (100, "", 'payload["a"][0]... is nested more than 100 levels deep'),
        (98, ", 0.1000000000000000055", 'payload["a"]' + "[0]" * 97 + "[1] is '0.1"),
    ],
)
def test_naming_the_path_of_a_refused_value_costs_about_the_payloads_size(depth, tail, message):
    """Migration 0029: the path is found by going down with jsonpath tests, not by a walk that
    copied every subtree at every level into temporary files (finding 11 of the review): a
    2 MB string at the bottom of {"a": [[...[<string><tail>]...]]}, ``depth`` arrays deep."""
    deep = (
        "('{\"a\": ' || repeat('[', %(depth)s) || '\"' || repeat('x', 2000000) || '\"'"
        " || %(tail)s || repeat(']', %(depth)s) || '}')::jsonb"
    )
    params = {"depth": depth, "tail": tail}
    with raw_connection() as conn:
        conn.execute("SET work_mem = '4MB'")
        size = conn.execute(f"SELECT pg_column_size({deep})", params).fetchone()[0]
        before = _temp_bytes(conn)
        diag = refusal(conn, f"SELECT dbqueue_enqueue('noop', {deep})", params)
        written = _temp_bytes(conn) - before
    assert diag.message_primary.startswith("dbqueue_enqueue: " + message), diag.message_primary
    assert written < 10 * size, f"{written:,} bytes of temporary files for a {size:,}-byte payload"
