"""Payload validation: JSON that survives a round trip unchanged, or an error naming the path."""

import json
import math

from .exceptions import PayloadError

_HINT = "convert it before enqueueing (str(), .isoformat(), a list, a plain dict)"


def _fail(path, message):
    raise PayloadError(f"{path} {message}")


def check(value, path="payload"):
    """Raise ``PayloadError`` naming the first value at ``path`` that JSON cannot carry unchanged.

    Allowed: ``dict`` with ``str`` keys, ``list``, ``str``, ``int``, finite ``float``, ``bool``,
    ``None`` (exact types: a tuple would come back a list, an enum a plain value).
    """
    kind = type(value)
    if value is None or kind is bool or kind is int:
        return
    if kind is str:
        if "\x00" in value:
            _fail(path, "contains a NUL character (\\x00), which PostgreSQL's jsonb cannot store")
        return
    if kind is float:
        if not math.isfinite(value):
            _fail(path, f"is {value!r}, which JSON cannot represent")
        return
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                _fail(
                    path,
                    f"has a key {key!r} of type {type(key).__name__}; JSON object keys are "
                    "strings, so it would come back changed",
                )
            check(item, f"{path}[{json.dumps(key, ensure_ascii=False)}]")
        return
    if kind is list:
        for index, item in enumerate(value):
            check(item, f"{path}[{index}]")
        return
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    what = "a tuple (use a list)" if kind is tuple else f"a {kind.__module__}.{kind.__qualname__}"
    _fail(path, f"is {what}: {shown}, which JSON cannot carry unchanged; {_HINT}")


def dumps(value):
    """Validate and serialise a payload; the text that goes into the ``jsonb`` column."""
    check(value)
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
