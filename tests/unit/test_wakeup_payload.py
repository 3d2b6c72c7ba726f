"""The wake-up payload "<count>:<queue>", the same naming its workers ("<count>/<slot>.<slot>:
<queue>"), and the bare queue names older senders sent."""

import pytest

from django_dbqueue.notifications import parse_named, parse_wakeup
from django_dbqueue.wakeup import payload


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("3:default", ("default", 3)),
        ("1:emails:eu", ("emails:eu", 1)),  # split on the first ':' only
        ("12:3:x", ("3:x", 12)),
        ("default", ("default", 1)),  # legacy: a bare queue name is one job
        ("emails:eu", ("emails:eu", 1)),  # legacy name with a ':' and a non-digit head
        ("²:q", ("²:q", 1)),  # a Unicode digit is not a count
        (":q", (":q", 1)),
        ("", ("", 1)),
        ("3/0.1.2.3:default", ("default", 3)),
        ("1/7:emails:eu", ("emails:eu", 1)),
        ("1/:q", ("1/:q", 1)),  # an empty slot is no slot: a bare name
        ("1/0.x:q", ("1/0.x:q", 1)),
        ("x/0:q", ("x/0:q", 1)),
        ("1/²:q", ("1/²:q", 1)),
    ],
)
def test_parse_wakeup(raw, expected):
    assert parse_wakeup(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("3/0.1.2.3:default", frozenset({0, 1, 2, 3})),
        ("1/7:emails:eu", frozenset({7})),
        ("3:default", None),  # names nobody: every waiting worker acts
        ("default", None),
        ("1/:q", None),
        ("1/0.x:q", None),
        ("cancel:1,2", None),
    ],
)
def test_parse_named(raw, expected):
    assert parse_named(raw) == expected


def test_payload_round_trips():
    assert parse_wakeup(payload(250, "a:b")) == ("a:b", 250)


def test_the_waiter_lock_classes_are_the_ones_the_enqueue_looks_at():
    from django_dbqueue import sql, wakeup_sql

    assert (wakeup_sql.WAITING_LOCK, wakeup_sql.ENQUEUING_LOCK) == (
        sql.WAITING_LOCK,
        sql.ENQUEUING_LOCK,
    )
