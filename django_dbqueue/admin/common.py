"""What the job lists share: a capped count, an exact search along indexes, preformatted and
shortened text."""

from django.core.paginator import Paginator
from django.db.models import Q
from django.utils.functional import cached_property
from django.utils.html import format_html

COUNT_CAP = 10_000


class CappedCountPaginator(Paginator):
    """Counts at most ``COUNT_CAP + 1`` rows (``SELECT count(*) FROM (... LIMIT n)``): a page of a
    million-row table costs a bounded count, and the page links stop at the cap."""

    @cached_property
    def count(self):
        return self.object_list[: COUNT_CAP + 1].count()


def exact_search(queryset, term, key_field, id_field="pk"):
    """Exact matches on indexed columns only. Django's own search wraps every column in UPPER()
    and so can never use an index: on a million rows that is a sequential scan per page."""
    term = term.strip()
    if not term:
        return queryset
    condition = Q(**{key_field: term})
    if term.isdigit() and len(term) < 19:
        condition |= Q(**{id_field: int(term)})
    return queryset.filter(condition)


def pre(value):
    return format_html('<pre style="white-space: pre-wrap; margin: 0">{}</pre>', value)


def shorten(text, limit):
    """``text``, or its first ``limit - 3`` characters and "..." when it is longer than ``limit``."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
