"""validation.len_digits() counts exactly, so that enqueue() takes every integer Python's json
reads back (at most 4300 digits) and refuses the others (issue 35: the SQL doors apply the same
bound, and tests/integration/test_sql_doors.py holds the two doors to one verdict)."""

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_dbqueue import payloads
from django_dbqueue.exceptions import PayloadError
from django_dbqueue.validation import len_digits


def digits(value):
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return len(str(abs(value)))
    finally:
        sys.set_int_max_str_digits(limit)


EDGES = [0, 1, 9, 10, 99, 100, 2**53, 10**4299, 10**4300 - 1, 10**4300, 10**4301 - 1]


@pytest.mark.parametrize("value", EDGES + [-v for v in EDGES], ids=range(2 * len(EDGES)))
def test_len_digits_is_the_number_of_decimal_digits(value):
    assert len_digits(value) == digits(value)


@given(st.integers(0, 10**5000) | st.integers(0, 10**30))
def test_len_digits_of_any_int(value):
    assert len_digits(value) == digits(value)


def test_an_int_of_4300_digits_is_a_payload_and_one_of_4301_is_not():
    payloads.check({"a": 10**4300 - 1})
    payloads.check({"a": -(10**4300 - 1)})
    with pytest.raises(PayloadError, match=r'payload\["a"\] is an integer of 4301 digits'):
        payloads.check({"a": 10**4300})
