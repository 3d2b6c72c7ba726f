"""Database text turned into Python values, or ``UnreadableJob`` naming the column and why.

PostgreSQL stores values that Python cannot read back: jsonb nested deeper than Python's
``json`` decodes (``RecursionError``), integers of more digits than Python converts (``ValueError``
past ``sys.get_int_max_str_digits()``, 4300 by default), numbers with a fraction and more than
308 digits (Python reads them as ``inf``: not the stored number), timestamps outside Python's
years 1 to 9999 (year 10000, BC, ``infinity``). The API never writes them (payloads.py,
validation.timestamp), but a plain ``UPDATE`` or a SQL caller can; the worker must then fail
that one job and go on (docs/handlers.md, "Rows Python cannot read").

Two ways in:
- ``fast_loads``: a claim's whole reply at once (store/claiming.py). ``json.loads`` with one hook,
  for the numbers written with a fraction (a float read as ``inf`` raises ``ValueError``). It
  names nothing: when it fails, the claim is read back row by row (the slow path).
- ``json_value`` and ``timestamp``: one value, in its own try, raising ``UnreadableJob`` with
  ``"<column>: <reason>"``.
"""

import datetime
import json
import re
import sys

from .exceptions import UnreadableJob


def _finite_float(text):
    value = float(text)
    if value - value != 0.0:  # inf (jsonb has no NaN and no Infinity literal)
        raise ValueError(f"the number {text[:20]}... ({len(text)} characters) reads as {value}")
    return value


# The claim's decoder: Python's own JSON decoder (its C scanner) with one hook, called for the
# numbers written with a fraction only (the wait of each job, and any in a payload): an int never
# calls it. It cost about 0.07 us per such number, 0.15 us per claimed job of a typical claim
# (a 1.5 us decode), measured with timeit on a loaded 2-core machine.
fast_loads = json.JSONDecoder(parse_float=_finite_float).decode


class _Refused(Exception):
    """A value the one-value decoder refuses (its reason), before the column is known."""


def _int(text):
    limit = sys.get_int_max_str_digits()
    digits = len(text) - text.startswith("-")
    if limit and digits > limit:
        raise _Refused(f"an integer of {digits} digits, more than Python reads ({limit})")
    return int(text)


def _float(text):
    value = float(text)
    if value - value != 0.0:
        raise _Refused(
            f"a number of {len(text)} characters ({text[:12]}...), beyond a float's range: "
            f"Python would read it as {value}"
        )
    return value


_one_value = json.JSONDecoder(parse_int=_int, parse_float=_float).decode
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


def depth(text):
    """How deeply the JSON ``text`` nests arrays and objects (strings skipped)."""
    deepest = level = 0
    for char in _NOT_BRACKETS.sub("", _STRINGS.sub("", text)):
        if char in "[{":
            level += 1
            deepest = max(deepest, level)
        else:
            level -= 1
    return deepest


def json_value(text, column):
    """The JSON ``text`` (jsonb's output) decoded, ``None`` for ``None``; ``UnreadableJob``
    naming ``column`` for a value Python cannot read back as stored."""
    if text is None:
        return None
    try:
        return _one_value(text)
    except _Refused as exc:
        raise UnreadableJob(column, str(exc)) from None
    except RecursionError:
        # (How deep that is depends on the Python: about 1,000 levels on 3.11 and 3.12, 10,000
        # on 3.13, and on the depth of the stack it is decoded on.)
        reason = (
            f"nested {depth(text)} levels deep, deeper than Python's json reads (RecursionError)"
        )
    except ValueError as exc:  # not JSON at all: never jsonb's output, but a column may be text
        reason = f"not JSON Python reads ({exc})"
    raise UnreadableJob(column, reason)


def timestamp(text, column):
    """A UTC timestamp written as PostgreSQL's JSON writes it (``to_json(t AT TIME ZONE 'UTC')``:
    ``2025-01-31T12:00:00.5``, or ``...BC``, ``10000-...``, ``infinity``), as an aware datetime;
    ``None`` for ``None``; ``UnreadableJob`` naming ``column`` outside Python's years 1 to
    9999."""
    if text is None:
        return None
    try:
        return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC)
    except ValueError:
        raise UnreadableJob(
            column, f"{text} (UTC) is outside what Python reads (years 1 to 9999)"
        ) from None
