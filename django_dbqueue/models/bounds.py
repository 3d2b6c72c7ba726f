"""The CHECK constraint that keeps a timestamp column within what Python reads back
(validation.TIMESTAMP_MIN..MAX, what every door accepts; NULL passes): migrations 0027 and 0030, issue 35.

A time PostgreSQL holds and Python does not (year 200000, 4000 BC, ``infinity``), written by
hand, failed whatever read it (psycopg's typed value of it fails the fetch of a whole reply, and
``now() - infinity`` fails the statement): a claim, the scheduler's pass over every entry, the
metrics, the admin's lists. The tables refuse it instead, naming the constraint.
"""

from django.db import models
from django.db.models import Q

from ..validation import TIMESTAMP_MAX, TIMESTAMP_MIN


def time_range(table, column):
    """``{table}_{column}_range``: ``column`` NULL or within TIMESTAMP_MIN..MAX."""
    return models.CheckConstraint(
        condition=Q(**{f"{column}__gte": TIMESTAMP_MIN, f"{column}__lte": TIMESTAMP_MAX}),
        name=f"{table}_{column}_range",
    )
