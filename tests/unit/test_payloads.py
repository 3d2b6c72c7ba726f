"""Payload validation is exact: what passes survives a JSON round trip unchanged."""

import json

from hypothesis import given
from hypothesis import strategies as st

from django_dbqueue.payloads import dumps

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text().filter(lambda s: "\x00" not in s),
    lambda children: (
        st.lists(children) | st.dictionaries(st.text().filter(lambda s: "\x00" not in s), children)
    ),
    max_leaves=20,
)


@given(json_values)
def test_accepted_payloads_round_trip_unchanged(value):
    assert json.loads(dumps(value)) == value
