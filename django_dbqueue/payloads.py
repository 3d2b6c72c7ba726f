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
    _check(value, (path,))


def _where(parts):
    # The path is only spelled out when there is an error to report.
    head, *rest = parts
    return head + "".join(
        f"[{json.dumps(part, ensure_ascii=False)}]" if isinstance(part, str) else f"[{part}]"
        for part in rest
    )


def _check(value, parts):
    kind = type(value)
    if value is None or kind is bool or kind is int:
        return
    if kind is str:
        if "\x00" in value:
            _fail(
                _where(parts),
                "contains a NUL character (\\x00), which PostgreSQL's jsonb cannot store",
            )
        return
    if kind is float:
        if not math.isfinite(value):
            _fail(_where(parts), f"is {value!r}, which JSON cannot represent")
        return
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                _fail(
                    _where(parts),
                    f"has a key {key!r} of type {type(key).__name__}; JSON object keys are "
                    "strings, so it would come back changed",
                )
            _check(item, (*parts, key))
        return
    if kind is list:
        for index, item in enumerate(value):
            _check(item, (*parts, index))
        return
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    what = "a tuple (use a list)" if kind is tuple else f"a {kind.__module__}.{kind.__qualname__}"
    _fail(_where(parts), f"is {what}: {shown}, which JSON cannot carry unchanged; {_HINT}")


def dumps(value, path="payload"):
    """Validate and serialise a payload; the text that goes into the ``jsonb`` column."""
    check(value, path)
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
