"""Database text turned into Python (decoding.py): what Python cannot read back is refused with
the column and the reason, never a bare ValueError or RecursionError; what it can is read as it
was stored."""

import datetime
import sys

import pytest

from django_dbqueue import decoding
from django_dbqueue.exceptions import UnreadableJob
from tests.poison import DEPTH


def refused(text, column="payload"):
    with pytest.raises(UnreadableJob) as caught:
        decoding.json_value(text, column)
    assert caught.value.column == column
    assert str(caught.value) == f"{column}: {caught.value.reason}"
    return caught.value.reason


def test_an_integer_past_pythons_digit_limit_is_named_with_its_digits():
    limit = sys.get_int_max_str_digits()
    assert refused('{"a": ' + "9" * 5000 + "}") == (
        f"an integer of 5000 digits, more than Python reads ({limit})"
    )
    assert refused("[-" + "9" * (limit + 1) + "]").startswith(f"an integer of {limit + 1} digits")
    assert decoding.json_value("9" * limit, "payload") == int("9" * limit)


def test_nesting_past_pythons_recursion_is_named_with_its_depth():
    assert refused("[" * DEPTH + "]" * DEPTH) == (
        f"nested {DEPTH} levels deep, deeper than Python's json reads (RecursionError)"
    )
    # Brackets inside strings are not nesting.
    text = '{"k": "[[[[{{{{\\"]]"' + ", " + '"x": ' + "[" * DEPTH + "]" * DEPTH + "}"
    assert refused(text).startswith(f"nested {DEPTH + 1} levels deep")
    assert decoding.json_value("[" * 100 + "]" * 100, "payload") is not None


def test_a_number_python_would_read_as_infinity_is_named():
    text = "1" + "0" * 400 + ".5"
    assert refused(f"[{text}]") == (
        "a number of 403 characters (100000000000...), beyond a float's range: Python would "
        "read it as inf"
    )
    # jsonb writes 1e400 as a 401-digit integer: Python reads it exactly.
    assert decoding.json_value("1" + "0" * 400, "payload") == 10**400


def test_the_fast_decoder_refuses_infinity_and_reads_everything_else_as_json_does():
    text = '[[1, "t", {"a": 1.5, "b": [1, 2.25e3]}, 0.000123]]'
    assert decoding.fast_loads(text) == [[1, "t", {"a": 1.5, "b": [1, 2250.0]}, 0.000123]]
    with pytest.raises(ValueError, match="reads as -inf"):
        decoding.fast_loads("[-1" + "0" * 400 + ".5]")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-01-31T12:00:00.5", datetime.datetime(2025, 1, 31, 12, 0, 0, 500000)),
        ("0001-01-01T00:00:00", datetime.datetime(1, 1, 1)),
        ("9999-12-31T23:59:59.999999", datetime.datetime(9999, 12, 31, 23, 59, 59, 999999)),
    ],
)
def test_a_timestamp_in_pythons_range_is_read_in_utc(text, expected):
    assert decoding.timestamp(text, "created_at") == expected.replace(tzinfo=datetime.UTC)


@pytest.mark.parametrize(
    "text", ["10000-01-01T00:00:00", "4000-01-01T00:00:00 BC", "infinity", "-infinity"]
)
def test_a_timestamp_outside_pythons_years_is_named(text):
    with pytest.raises(UnreadableJob) as caught:
        decoding.timestamp(text, "run_after")
    assert str(caught.value) == (
        f"run_after: {text} (UTC) is outside what Python reads (years 1 to 9999)"
    )


def test_none_stays_none():
    assert decoding.json_value(None, "result") is None
    assert decoding.timestamp(None, "finished_at") is None
