"""Payload validation is exact: what passes survives a JSON round trip unchanged."""

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_dbqueue.exceptions import PayloadError
from django_dbqueue.payloads import check, dumps

# Text PostgreSQL can store: no NUL, no lone surrogate (category Cs).
storable_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False, min_value=-9.999e15, max_value=9.999e15)
    # -0.0 is refused: jsonb's numeric has no negative zero (see the -0.0 cases below)
    .filter(lambda f: math.copysign(1.0, f) > 0 or f != 0)
    | storable_text,
    lambda children: st.lists(children) | st.dictionaries(storable_text, children),
    max_leaves=20,
)


@given(json_values)
def test_accepted_payloads_round_trip_unchanged(value):
    assert json.loads(dumps(value)) == value


def nested(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"n": 1e16}, 'payload["n"] is the float 1e+16: PostgreSQL\'s jsonb returns'),
        ({"n": [-1e308]}, 'payload["n"][0] is the float -1e+308'),
        ({"a\x00b": 1}, "payload has a key 'a\\x00b' that contains a NUL character"),
        ({"s": "ok \ud800"}, "payload[\"s\"] contains a lone surrogate ('\\ud800' at index 3)"),
        ({"\udc80": 1}, "payload has a key '\\udc80' that contains a lone surrogate"),
        ({"deep": nested(10_000)}, "is nested more than 100 levels deep"),
        ({"big": 10**5000}, 'payload["big"] is an integer of 5001 digits; at most 4300'),
        ({1: "x"}, "has a key 1 of type int"),
        ({"t": -0.0}, 'payload["t"] is -0.0: PostgreSQL\'s jsonb keeps numbers as numeric'),
        ({"t": [{"u": -0.0}]}, 'payload["t"][0]["u"] is -0.0'),
        (-0.0, "payload is -0.0"),
    ],
)
def test_payloads_that_would_not_survive_are_refused_by_path(payload, fragment):
    with pytest.raises(PayloadError) as caught:
        dumps(payload)
    assert fragment in str(caught.value)


def test_limits_are_inclusive_where_they_should_be():
    # nested(98) is 99 lists; inside the payload dict, 100 levels: the most allowed.
    assert json.loads(dumps({"f": 9999999999999998.0, "i": 10**4299, "d": nested(98)})) == {
        "f": 9999999999999998.0,
        "i": 10**4299,
        "d": nested(98),
    }
    with pytest.raises(PayloadError, match="nested more than 100 levels"):
        dumps({"d": nested(99)})


def test_a_result_is_told_to_return_json_not_to_convert_before_enqueueing():
    with pytest.raises(PayloadError, match="return a JSON value instead") as caught:
        check({1, 2}, "result")
    assert "enqueueing" not in str(caught.value)
    with pytest.raises(PayloadError, match="convert it before enqueueing"):
        check({1, 2})


@pytest.mark.parametrize("value", [0.0, -0.0, 1e-320, -1e-320, -5e-324])
def test_zero_and_the_tiniest_floats_keep_their_sign_or_are_refused(value):
    # Only a negative zero loses its sign in jsonb; the tiniest negative numbers keep theirs.
    if value == 0 and math.copysign(1.0, value) < 0:
        with pytest.raises(PayloadError, match=r'^payload\["z"\] is -0.0'):
            dumps({"z": value})
    else:
        assert json.loads(dumps({"z": value}))["z"] == value


def test_a_result_of_negative_zero_is_refused_by_its_path():
    from django_dbqueue.outcomes import ResultError, encode_result

    with pytest.raises(ResultError, match=r'result\["totals"\]\[2\] is -0.0') as caught:
        encode_result({"totals": [1.5, 0.0, -0.0]})
    assert isinstance(caught.value, TypeError)
