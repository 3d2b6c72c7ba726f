"""A hostile review of the events' doors of issue 35 (the events page, a job's link to its event,
replay_event()) around an event row Python cannot read: written by hand, as docs/admin.md's
"Rows Python cannot read" has job rows written (a published_at of year 200000, a payload of
5000 digits). Each finding is an xfail(strict=True) test.
"""

import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.urls import reverse

from django_dbqueue import publish, replay_event
from django_dbqueue.exceptions import DBQueueError

pytestmark = pytest.mark.django_db(transaction=True)

DIGITS = """('{"a":' || repeat('9', 5000) || '}')::jsonb"""


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_superuser("boss", password="pw"))
    client.raise_request_exception = False  # a page that fails answers 500, and the test goes on
    return client


def sql(statement, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


@pytest.fixture
def event():
    """An event with its subscribers' jobs, and its row then written by hand."""
    return publish("test.invoice.paid", {"invoice": 1})


def status(client, name, *args):
    return client.get(reverse(name, args=args)).status_code


def test_an_event_time_python_cannot_read_is_refused_by_the_table(event):
    """Finding 6a (an event row with a published_at Python cannot read failed the events list,
    the event's page and the page of every job it made): migration 0027's CHECK
    dbqueue_event_published_at_range closes that door, so no such row can be written, by hand
    either; a row of before 0027 was repaired by the migration (test_migration_0027.py)."""
    poison = "UPDATE dbqueue_event SET published_at = '200000-01-01 00:00:00+00' WHERE id = %s"
    with (
        pytest.raises(IntegrityError, match="dbqueue_event_published_at_range"),
        transaction.atomic(),
    ):
        sql(poison, [event.id])


def test_the_pages_answer_around_an_event_with_a_payload_python_cannot_read(staff, event):
    """Finding 6b: an event row with a payload Python's json refuses failed the events list
    and the event's page (the ORM's JSONField read in admin/events.py)."""
    sql(f"UPDATE dbqueue_event SET payload = {DIGITS} WHERE id = %s", [event.id])
    assert {
        "events list": status(staff, "admin:django_dbqueue_event_changelist"),
        "event page": status(staff, "admin:django_dbqueue_event_change", event.id),
    } == {"events list": 200, "event page": 200}


def test_replaying_an_event_python_cannot_read_names_it(event):
    """Finding 6c: replay_event() of such an event raised the bare ValueError of Python's json
    (events.replay_event's json.loads), not an error of the package naming the event. (Its
    other half, a published_at Python cannot read, is refused by the table: above.)"""
    sql(f"UPDATE dbqueue_event SET payload = {DIGITS} WHERE id = %s", [event.id])
    with pytest.raises(DBQueueError) as refused:
        replay_event(event.id, ["late-subscriber"])
    assert f"event {event.id}" in str(refused.value) or f"#{event.id}" in str(refused.value)
    assert "payload" in str(refused.value)
