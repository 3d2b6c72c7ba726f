"""A hostile review of the schedules' doors of issue 35 (five-field cron, IANA zones, the stored
entries a worker's scheduler reads): what still makes a periodic job run more than once per
tick, or stops the other entries. Each finding is an xfail(strict=True) test.

The worker's scheduler is driven as the worker drives it: ``Scheduler.run_once()``, one pass.
"""

import datetime
import io
import random

import pytest
from django.db import connection

from django_dbqueue.conf import get_settings
from django_dbqueue.schedule_entries import ScheduleError, schedule_job
from django_dbqueue.schedule_parser import parse_entry
from django_dbqueue.scheduler import Scheduler
from tests.utils import scalar

pytestmark = pytest.mark.django_db(transaction=True)

HOUR = 3600


@pytest.fixture(autouse=True)
def queues(settings):
    settings.DBQUEUE = {
        "QUEUES": {"default": {}},
        "SCHEDULE": {"from-settings": {"every": HOUR, "type": "noop"}},
    }


def sql(statement, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def last_hour_due(table, name):
    """The entry's last tick one second before the latest whole hour: that hour's tick is due."""
    sql(
        f"UPDATE {table} SET last_tick = to_timestamp("
        "floor(extract(epoch FROM now()) / 3600) * 3600 - 1) WHERE name = %s",
        [name],
    )


def made(name):
    return scalar(
        "SELECT count(*) FROM dbqueue_job WHERE idempotency_key LIKE %s",
        [f"dbqueue-schedule:{name}:%"],
    )


# -- finding 4: one stored entry Python cannot read stops every other entry's ticks ---------------


@pytest.fixture
def due_entries():
    """A settings entry and two stored ones, each with its last hour's tick due; ``broken`` is
    the stored entry that the test makes unreadable (it comes first in the table's order: each
    UPDATE below writes a newer row version, and ``good``'s is written last)."""
    Scheduler().run_once()  # first sight of the settings entry: it gets its row
    schedule_job("broken", "noop", every=HOUR)
    schedule_job("good", "noop", every=HOUR)
    last_hour_due("dbqueue_schedule", "from-settings")
    last_hour_due("dbqueue_schedule_entry", "broken")


@pytest.mark.xfail(
    strict=True,
    reason="finding 4a: a stored entry whose payload Python's json refuses (a direct row write) "
    "raises ValueError out of Scheduler.run_once() (schedule_parser.parse_stored's json.loads, "
    "scheduler.Scheduler._stored catches ScheduleError only): every pass of every worker "
    "fails there, and the entries after it never tick",
)
def test_a_stored_entry_python_cannot_read_is_ignored_and_the_others_tick(due_entries):
    sql(
        """UPDATE dbqueue_schedule_entry SET payload = ('{"a":' || repeat('9', 5000) || '}')::jsonb
           WHERE name = 'broken'"""
    )
    last_hour_due("dbqueue_schedule_entry", "good")
    counts = Scheduler().run_once()
    assert counts["enqueued"] == 2
    assert (made("from-settings"), made("good"), made("broken")) == (1, 1, 0)


@pytest.mark.xfail(
    strict=True,
    reason="finding 4b: a stored entry whose last_tick is outside Python's range (year 200000, "
    "a direct row write) fails the pass's one read (store/schedule.py SCHEDULE_STATE): no "
    "entry ticks any more, the settings' included, in any worker",
)
def test_a_stored_entry_with_a_time_python_cannot_read_stops_no_other_entry(due_entries):
    sql(
        "UPDATE dbqueue_schedule_entry SET last_tick = '200000-01-01 00:00:00+00' "
        "WHERE name = 'broken'"
    )
    last_hour_due("dbqueue_schedule_entry", "good")
    Scheduler().run_once()
    assert (made("from-settings"), made("good"), made("broken")) == (1, 1, 0)


# -- finding 5: croniter's random field is accepted, and ticks at a new minute on every read ------


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="finding 5: 'R * * * *' passes the five-field check (croniter.is_valid), and croniter "
    "draws R's minute from the random module each time the schedule is read, so each pass (and "
    "each worker) computes other ticks, each with its own idempotency key: several jobs an hour "
    "(schedule_parser._cron; schedule.Schedule reads croniter(cron, ...) with no hash_id)",
)
def test_a_random_cron_field_is_refused_or_ticks_once_per_hour():
    try:
        schedule = parse_entry(
            "hourly-somewhen", {"type": "noop", "cron": "R * * * *"}, get_settings()
        )
    except ScheduleError:
        return  # refused, like croniter's other per-instance field, H
    start = datetime.datetime(2030, 1, 1, 0, 0, tzinfo=datetime.UTC)
    end = start + datetime.timedelta(hours=1)
    seen = set()
    state = random.getstate()
    try:
        for seed in (1, 2):  # two passes (or two workers) that read the entry
            random.seed(seed)
            seen.add(tuple(schedule.ticks_between(start, end, 10)))
    finally:
        random.setstate(state)
    assert len(seen) == 1, f"one hour's ticks, read twice: {sorted(seen)}"


@pytest.fixture
def staff(client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("boss", password="pw"))
    client.raise_request_exception = False  # a page that fails answers 500
    return client


@pytest.mark.xfail(
    strict=True,
    reason="finding 4c: the schedules page and jobqueue_status fail on a stored entry Python "
    "cannot read (the ORM's read of its payload or last_tick; store.schedule_status), where the "
    "job pages and jobqueue_status --job answer around such rows (docs/admin.md)",
)
@pytest.mark.parametrize(
    "poison",
    [
        """payload = ('{"a":' || repeat('9', 5000) || '}')::jsonb""",
        "last_tick = '200000-01-01 00:00:00+00'",
    ],
    ids=["payload", "last_tick"],
)
def test_the_schedules_page_and_the_status_answer_around_an_unreadable_entry(staff, poison):
    from django.core.management import call_command
    from django.urls import reverse

    schedule_job("broken", "noop", every=HOUR)
    schedule_job("good", "noop", every=HOUR)
    sql(f"UPDATE dbqueue_schedule_entry SET {poison} WHERE name = 'broken'")
    response = staff.get(reverse("admin:django_dbqueue_scheduleentry_changelist"))
    assert response.status_code == 200
    assert "good" in response.content.decode()
    out = io.StringIO()
    call_command("jobqueue_status", stdout=out)
    assert "schedule good (database)" in out.getvalue()
