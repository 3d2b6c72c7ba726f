"""Payload validation: JSON that survives a round trip unchanged, or an error naming the path."""

import json
import math

from .exceptions import PayloadError
from .validation import len_digits, shown, text_problem

# What to do about a value that cannot be stored, by what it is: a payload or a handler's result.
_HINTS = {
    "result": "return a JSON value instead (str(), .isoformat(), a list, a plain dict)",
}
_HINT = "convert it before enqueueing (str(), .isoformat(), a list, a plain dict)"

# jsonb keeps numbers as PostgreSQL numeric and prints them back without an exponent, so a float
# of magnitude 1e16 or more (Python writes it as 1e+16) comes back as an integer, and 1e308 as a
# 309-digit integer that is not the same number. Below this bound every finite float's shortest
# repr reads back as the very same float.
FLOAT_LIMIT = 1e16
MAX_INT_DIGITS = 4300  # Python's default int <-> str limit; also far inside jsonb's numeric
MAX_DEPTH = 100  # levels of nested lists and dicts; deeper is a mistake, and recursion fails


def _fail(path, message):
    raise PayloadError(f"{path} {message}")


def check(value, path="payload"):
    """Raise ``PayloadError`` naming the first value at ``path`` that JSON cannot carry unchanged.

    Allowed: ``dict`` with ``str`` keys, ``list``, ``str``, ``int``, finite ``float``, ``bool``,
    ``None`` (exact types: a tuple would come back a list, an enum a plain value); text that
    PostgreSQL can store (no NUL, no lone surrogate), floats below 1e16 in magnitude and not
    ``-0.0`` (jsonb's numeric has no negative zero: it would come back ``0.0``), integers of
    at most 4300 digits, nesting at most 100 levels deep.
    """
    _check(value, (path,))


def _where(parts):
    # The path is only spelled out when there is an error to report.
    head, *rest = parts
    return head + "".join(
        f"[{json.dumps(part, ensure_ascii=text_problem(part) is not None)}]"
        if isinstance(part, str)
        else f"[{part}]"
        for part in rest
    )


def _check(value, parts):
    kind = type(value)
    if value is None or kind is bool:
        return
    if kind is int:
        if value.bit_length() > 3 * MAX_INT_DIGITS and len_digits(value) > MAX_INT_DIGITS:
            _fail(
                _where(parts),
                f"is an integer of {len_digits(value)} digits; at most {MAX_INT_DIGITS} digits "
                "can be written as JSON (send it as a string)",
            )
        return
    if kind is str:
        problem = text_problem(value)
        if problem:
            _fail(_where(parts), problem)
        return
    if kind is float:
        if not math.isfinite(value):
            _fail(_where(parts), f"is {value!r}, which JSON cannot represent")
        if abs(value) >= FLOAT_LIMIT:
            _fail(
                _where(parts),
                f"is the float {value!r}: PostgreSQL's jsonb returns a float of magnitude 1e16 or "
                "more as a different number (an integer), so it would come back changed; send an "
                "int or a string",
            )
        if not value and math.copysign(1.0, value) < 0:
            _fail(
                _where(parts),
                "is -0.0: PostgreSQL's jsonb keeps numbers as numeric, which has no negative "
                "zero, so it would come back as 0.0 with its sign lost; send 0.0, or a string "
                "if the sign matters",
            )
        return
    if kind is dict or kind is list:
        if len(parts) > MAX_DEPTH:
            _fail(_where(parts[:3]) + "...", f"is nested more than {MAX_DEPTH} levels deep")
        if kind is list:
            for index, item in enumerate(value):
                _check(item, (*parts, index))
            return
        for key, item in value.items():
            if type(key) is not str:
                _fail(
                    _where(parts),
                    f"has a key {shown(key)} of type {type(key).__name__}; JSON object keys are "
                    "strings, so it would come back changed",
                )
            problem = text_problem(key)
            if problem:
                _fail(_where(parts), f"has a key {shown(key)} that {problem}")
            _check(item, (*parts, key))
        return
    what = "a tuple (use a list)" if kind is tuple else f"a {kind.__module__}.{kind.__qualname__}"
    hint = _HINTS.get(parts[0], _HINT)
    _fail(_where(parts), f"is {what}: {shown(value)}, which JSON cannot carry unchanged; {hint}")


# One encoder for every call: json.dumps() with these options builds a new one each time.
_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def dumps(value, path="payload"):
    """Validate and serialise a payload; the text that goes into the ``jsonb`` column."""
    check(value, path)
    return _ENCODER.encode(value)
