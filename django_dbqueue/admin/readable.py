"""The job pages' reads of values Python may not read back (docs/admin.md, "Rows Python cannot
read"): a row written by hand may hold a timestamp of year 200000 or 4000 BC, or JSON that
Python's ``json`` refuses. The ORM's read of such a row fails (psycopg's DataError, a ValueError
from the JSON field), and with it the whole page. So the job pages never load those columns into
the model: each timestamp comes as two annotations of the list's own query (no query per row),
``at_<column>`` (the value, inside validation.TIMESTAMP_MIN..MAX, which any time zone can show)
and ``text_<column>`` (PostgreSQL's text of it, outside); the last error as two texts; and the
JSON columns of one job, on its page, as text decoded here (decoding.json_value)."""

import json

from django.db.models import Case, DateTimeField, Q, TextField, When
from django.db.models.fields.json import KeyTextTransform, KeyTransform
from django.db.models.functions import Cast
from django.utils.html import format_html

from .. import decoding
from ..exceptions import UnreadableJob
from ..validation import TIMESTAMP_MAX, TIMESTAMP_MIN
from .common import pre

TIMESTAMPS = (
    "run_after",
    "created_at",
    "started_at",
    "finished_at",
    "leased_until",
    "cancel_requested_at",
)
JSON_COLUMNS = ("payload", "result", "errors")
RAW_CHARS = 10_000  # of an unreadable JSON value's text shown on its page


def time_annotations(names=TIMESTAMPS):
    """``at_<name>`` and ``text_<name>`` for each timestamp column: one of them set, the other
    NULL (both NULL for NULL)."""
    annotations = {}
    for name in names:
        inside = Q(**{f"{name}__gte": TIMESTAMP_MIN, f"{name}__lte": TIMESTAMP_MAX})
        outside = Q(**{f"{name}__lt": TIMESTAMP_MIN}) | Q(**{f"{name}__gt": TIMESTAMP_MAX})
        annotations[f"at_{name}"] = Case(
            When(inside, then=name), default=None, output_field=DateTimeField()
        )
        annotations[f"text_{name}"] = Case(
            When(outside, then=Cast(name, TextField())), default=None, output_field=TextField()
        )
    return annotations


def last_error_annotations():
    """The last entry of the error history, its class and message as text (never decoded)."""
    last = KeyTransform(-1, "errors")
    return {
        "last_error_class": KeyTextTransform("class", last),
        "last_error_message": KeyTextTransform("message", last),
    }


def readable(queryset):
    """``queryset`` with the timestamps and JSON columns deferred and read as above."""
    return (
        queryset.defer(*TIMESTAMPS, *JSON_COLUMNS)
        .annotate(**time_annotations())
        .annotate(**last_error_annotations())
    )


def time_of(obj, name):
    """A timestamp column of a row read by :func:`readable`: the datetime, or its text marked
    ``(out of range)``, or None."""
    text = getattr(obj, f"text_{name}", None)
    if text is not None:
        return f"{text} (out of range)"
    return getattr(obj, f"at_{name}", None)


def json_texts(obj):
    """``{column: JSON text or None}`` of the job's JSON columns: one query, kept on ``obj``."""
    texts = getattr(obj, "_dbqueue_json_texts", None)
    if texts is None:
        values = (
            type(obj)
            ._base_manager.filter(pk=obj.pk)
            .values_list(*(Cast(column, TextField()) for column in JSON_COLUMNS))
            .first()
        )
        texts = dict(zip(JSON_COLUMNS, values or (None,) * len(JSON_COLUMNS), strict=True))
        obj._dbqueue_json_texts = texts
    return texts


def json_of(obj, column):
    """``(value, None)``, or ``(None, UnreadableJob)`` for a value Python cannot read back."""
    try:
        return decoding.json_value(json_texts(obj)[column], column), None
    except UnreadableJob as exc:
        return None, exc


def unreadable_html(obj, column, exc):
    """What a page shows of a JSON value Python cannot read: the reason, and the start of the
    text PostgreSQL holds."""
    return unreadable_text_html(json_texts(obj)[column], exc)


def unreadable_text_html(text, exc):
    """:func:`unreadable_html` of a value's ``text`` (jsonb's output), read by the caller."""
    text = text or ""
    cut = text if len(text) <= RAW_CHARS else text[:RAW_CHARS] + f"... ({len(text):,} characters)"
    return format_html("<p>unreadable: {}</p>{}", exc.reason, pre(cut))


def pretty(value, **options):
    """``value`` as indented JSON, or None when even that fails (a readable value nested too
    deep for the encoder's indentation)."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, **options)
    except (ValueError, RecursionError):
        return None
