"""Rows Python cannot read, as direct SQL writes them (the tests of docs/handlers.md, "Rows Python
cannot read"): the SET clause of each kind, and the start of the message its UnreadableJob gets.

How deep JSON must nest for Python's json to refuse it depends on the Python: 3.11 and 3.12 stop
near 1,000 levels (1,500 is the issue's example), 3.13 near 10,000. ``DEPTH`` is the first of a
few depths that this Python refuses; jsonb stores 10,000 levels under PostgreSQL's default
max_stack_depth."""

import contextlib
import importlib
import json

from django.db import connection


def _unreadable_depth():
    for depth in (1_500, 10_000, 20_000, 40_000):
        try:
            json.loads("[" * depth + "]" * depth)
        except RecursionError:
            return depth
    raise AssertionError("this Python's json reads arrays nested 40,000 deep")


DEPTH = _unreadable_depth()
NESTED = f"(repeat('[', {DEPTH}) || repeat(']', {DEPTH}))::jsonb"

# kind: (the SET clause that poisons the row, the start of the error message it must get)
POISON = {
    "payload-5000-digits": (
        """payload = ('{"a":' || repeat('9', 5000) || '}')::jsonb""",
        "payload: an integer of 5000 digits, more than Python reads (4300)",
    ),
    "payload-too-deep": (
        f"payload = {NESTED}",
        f"payload: nested {DEPTH} levels deep, deeper than Python's json reads",
    ),
    # 1e400 itself is stored by jsonb as a 401-digit integer, which Python reads exactly; with a
    # fraction it stays a 403-character decimal that Python's float reads as inf.
    "payload-read-as-infinity": (
        """payload = ('{"a":1' || repeat('0', 400) || '.5}')::jsonb""",
        "payload: a number of 403 characters (100000000000...), beyond a float's range",
    ),
    "created_at-year-10000": (
        "created_at = '10000-01-01 00:00:00+00'",
        "created_at: 10000-01-01T00:00:00 (UTC) is outside what Python reads (years 1 to 9999)",
    ),
    "created_at-bc": (
        "created_at = '4000-01-01 00:00:00+00 BC'",
        "created_at: 4000-01-01T00:00:00 BC (UTC) is outside what Python reads",
    ),
    "run_after-bc": (
        "run_after = '4000-01-01 00:00:00+00 BC'",
        "run_after: 4000-01-01T00:00:00 BC (UTC) is outside what Python reads",
    ),
    "run_after-minus-infinity": (
        "run_after = '-infinity'",
        "run_after: -infinity (UTC) is outside what Python reads",
    ),
}


BOUNDS = [
    importlib.import_module("django_dbqueue.migrations.0027_bounded_rows"),
    importlib.import_module("django_dbqueue.migrations.0030_bounded_side_tables"),
]


@contextlib.contextmanager
def unbounded():
    """Migrations 0027's and 0030's CHECKs dropped for the block, as by an owner of the tables
    who dropped them: the timestamps above can be written then, and the worker and the admin
    must still cope with them. On the way out the rows are repaired as the migrations repair
    them and the constraints added again."""
    with connection.cursor() as cursor:
        for bounds in BOUNDS:
            cursor.execute(bounds.DROP_CONSTRAINTS)
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            for bounds in BOUNDS:
                bounds.repair_rows(cursor)
                cursor.execute(bounds.ADD_CONSTRAINTS)
