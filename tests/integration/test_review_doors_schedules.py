"""A hostile review of the schedules' doors of issue 35 (five-field cron, IANA zones, the stored
entries a worker's scheduler reads): what still makes a periodic job run more than once per
tick, or stops the other entries. Each finding is an xfail(strict=True) test.

The worker's scheduler is driven as the worker drives it: ``Scheduler.run_once()``, one pass.
"""

import importlib
import io

import pytest
from django.db import IntegrityError, connection, transaction

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


def test_a_stored_entry_python_cannot_read_is_ignored_and_the_others_tick(due_entries):
    """Finding 4a: a stored entry whose payload Python's json refuses (a direct row write)
    raised ValueError out of Scheduler.run_once() (schedule_parser.parse_stored's json.loads):
    every pass of every worker failed there, and the entries after it never ticked."""
    sql(
        """UPDATE dbqueue_schedule_entry SET payload = ('{"a":' || repeat('9', 5000) || '}')::jsonb
           WHERE name = 'broken'"""
    )
    last_hour_due("dbqueue_schedule_entry", "good")
    counts = Scheduler().run_once()
    assert counts["enqueued"] == 2
    assert (made("from-settings"), made("good"), made("broken")) == (1, 1, 0)


@pytest.mark.parametrize("table", ["dbqueue_schedule_entry", "dbqueue_schedule"])
def test_a_stored_time_python_cannot_read_is_refused_by_the_table(due_entries, table):
    """Finding 4b (a stored entry whose last_tick is outside Python's range, year 200000,
    failed the pass's one read, store/schedule.py SCHEDULE_STATE: no entry ticked any more)
    and 4c's last_tick (the schedules page and jobqueue_status failed on it): migration 0027's
    CHECK on each table closes that door, so no such row can be written, by hand either; a row
    of before 0027 was repaired by the migration (test_migration_0027.py)."""
    name = "broken" if table == "dbqueue_schedule_entry" else "from-settings"
    with pytest.raises(IntegrityError, match=f"{table}_last_tick_range"), transaction.atomic():
        sql(f"UPDATE {table} SET last_tick = '200000-01-01 00:00:00+00' WHERE name = %s", [name])
    Scheduler().run_once()
    assert (made("from-settings"), made("broken")) == (1, 1)


TABLES = {"dbqueue_schedule_entry": "broken", "dbqueue_schedule": "from-settings"}


@pytest.fixture
def unchecked():
    """The tables of the entries without migration 0027's CHECKs on last_tick (a database whose
    constraints were dropped), put back after the test with the rows it wrote repaired."""
    bounds = importlib.import_module("django_dbqueue.migrations.0027_bounded_rows")._in_bounds
    for table in TABLES:
        sql(f"ALTER TABLE {table} DROP CONSTRAINT {table}_last_tick_range")
    yield
    for table in TABLES:
        sql(f"UPDATE {table} SET last_tick = now() WHERE NOT ({bounds('last_tick')})")
        sql(
            f"ALTER TABLE {table} ADD CONSTRAINT {table}_last_tick_range "
            f"CHECK ({bounds('last_tick')})"
        )


@pytest.mark.parametrize(
    "value", ["200000-01-01 00:00:00+00", "infinity", "4000-01-01 00:00:00+00 BC"]
)
@pytest.mark.parametrize("table", sorted(TABLES))
def test_a_time_python_cannot_read_in_a_table_without_its_check_stops_no_other_entry(
    due_entries, unchecked, table, value
):
    """Finding 4b, where the CHECK was dropped: the pass reads each last tick held within the
    range Python reads (as migration 0027 repaired such rows), so the others tick; a time after
    the range never comes due, one before it is due, and its tick writes a real time."""
    broken = TABLES[table]
    sql(f"UPDATE {table} SET last_tick = %s::timestamptz WHERE name = %s", [value, broken])
    last_hour_due("dbqueue_schedule_entry", "good")
    Scheduler().run_once()
    expected = {"from-settings": 1, "good": 1, "broken": 1, broken: int(value.endswith("BC"))}
    assert {name: made(name) for name in expected} == expected
    if value.endswith("BC"):
        assert scalar(
            f"SELECT last_tick > now() - interval '2 hours' FROM {table} WHERE name = %s", [broken]
        )


# -- finding 5: croniter's random field is accepted, and ticks at a new minute on every read ------


@pytest.mark.parametrize("cron", ["R * * * *", "0 R * * *", "r(0-29) * * * *", "R/15 * * * *"])
def test_a_random_cron_field_is_refused_at_every_door(cron, settings, caplog):
    """Finding 5: 'R * * * *' passed the five-field check (croniter.is_valid), and croniter
    draws R's minute from the random module each time the schedule is read, so each pass (and
    each worker) computed other ticks, each with its own idempotency key: several jobs an hour.
    It is refused, like croniter's other per-instance field, H: in the settings (the check and
    the worker), by schedule_job(), and a stored entry holding one (a row written by hand, or
    before the refusal) is ignored."""
    with pytest.raises(ScheduleError, match="has a random field") as refused:
        parse_entry("hourly-somewhen", {"type": "noop", "cron": cron}, get_settings())
    assert refused.value.field == "cron" and "croniter draws its value anew" in str(refused.value)
    with pytest.raises(ScheduleError, match="has a random field"):
        schedule_job("hourly-somewhen", "noop", cron=cron)
    schedule_job("stored", "noop", cron="* * * * *")
    sql(
        "UPDATE dbqueue_schedule_entry SET cron = %s, last_tick = now() - interval '2 hours' "
        "WHERE name = 'stored'",
        [cron],
    )
    with caplog.at_level("ERROR", logger="django_dbqueue"):
        Scheduler().run_once()
    assert made("stored") == 0
    assert "schedule entry 'stored' ignored" in caplog.text and "random field" in caplog.text


def test_a_random_cron_field_is_refused_by_the_admin_form(staff):
    from django.urls import reverse

    response = staff.post(
        reverse("admin:django_dbqueue_scheduleentry_add"),
        {
            "name": "hourly-somewhen",
            "job_type": "noop",
            "payload": "{}",
            "queue": "default",
            "priority": "0",
            "cron": "R * * * *",
            "every": "",
            "timezone": "UTC",
            "enabled": "on",
            "catch_up": "latest",
            "catch_up_window": "",
            "misfire_grace": "60",
        },
    )
    assert response.status_code == 200  # the form again, with the error
    assert "has a random field" in " ".join(response.context["adminform"].form.errors["cron"])
    assert not scalar("SELECT count(*) FROM dbqueue_schedule_entry")


@pytest.fixture
def staff(client):
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_superuser("boss", password="pw"))
    client.raise_request_exception = False  # a page that fails answers 500
    return client


def test_the_schedules_page_and_the_status_answer_around_an_unreadable_entry(staff):
    """Finding 4c: the schedules page and jobqueue_status failed on a stored entry whose
    payload Python cannot read (the ORM's read; store.schedule_status), where the job pages
    and jobqueue_status --job answer around such rows (docs/admin.md). Its last_tick half is
    refused by the table: test_a_stored_time_python_cannot_read_is_refused_by_the_table."""
    from django.core.management import call_command
    from django.urls import reverse

    schedule_job("broken", "noop", every=HOUR)
    schedule_job("good", "noop", every=HOUR)
    sql(
        """UPDATE dbqueue_schedule_entry SET payload = ('{"a":' || repeat('9', 5000) || '}')::jsonb
           WHERE name = 'broken'"""
    )
    response = staff.get(reverse("admin:django_dbqueue_scheduleentry_changelist"))
    assert response.status_code == 200
    assert "good" in response.content.decode()
    out = io.StringIO()
    call_command("jobqueue_status", stdout=out)
    assert "schedule good (database)" in out.getvalue()
