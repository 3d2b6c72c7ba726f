"""Records outside the claim that a row written by hand can make unreadable (issue 35): an
event's stored payload and subscribers, a stored schedule entry's payload, a django.tasks
result, the times of the tables the scheduler, the metrics and the admin read, and a payload
that a worker decoded but cannot hand to a handler process. Each fails alone, with an error
naming what it could not read; the scheduler goes on with its other entries, the pages answer.
"""

import json
import logging

import django
import pytest
from django.contrib.auth.models import User
from django.db import IntegrityError, connection, transaction
from django.urls import reverse

from django_dbqueue import EnqueueError, enqueue, publish, replay_event, schedule_job
from django_dbqueue.models import ScheduleEntry
from django_dbqueue.scheduler import Scheduler, status
from django_dbqueue.worker import Worker
from tests.integration.conftest import FAST
from tests.poison import DEPTH, NESTED
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

DIGITS = """('{"a":' || repeat('9', 5000) || '}')::jsonb"""


def sql(statement, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_superuser("boss", password="pw"))
    return client


# -- events ---------------------------------------------------------------------------------------


def test_a_replay_of_an_event_whose_payload_python_cannot_read_says_so_and_enqueues_nothing():
    event = publish("test.unheard", {"n": 1})
    sql(f"UPDATE dbqueue_event SET payload = {NESTED} WHERE id = %s", [event.id])
    before = scalar("SELECT count(*) FROM dbqueue_job")
    with pytest.raises(EnqueueError) as caught:
        replay_event(event.id, ["echo"])
    message = str(caught.value)
    assert message.startswith(f"event #{event.id} ('test.unheard'): its stored payload")
    assert f"nested {DEPTH} levels deep" in message and "nothing was enqueued" in message
    assert scalar("SELECT count(*) FROM dbqueue_job") == before


def test_the_event_pages_show_a_payload_and_subscribers_python_cannot_read(staff):
    good = publish("test.good", {"n": 1})
    bad = publish("test.bad", {"n": 2})
    sql(
        f"UPDATE dbqueue_event SET payload = {DIGITS}, subscribers = {NESTED} WHERE id = %s",
        [bad.id],
    )
    listing = staff.get(reverse("admin:django_dbqueue_event_changelist"))
    assert listing.status_code == 200
    text = listing.content.decode()
    assert "test.good" in text and "test.bad" in text
    assert f"unreadable: nested {DEPTH} levels deep" in text
    page = staff.get(reverse("admin:django_dbqueue_event_change", args=[bad.id]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "unreadable: an integer of 5000 digits, more than Python reads (4300)" in text
    assert (
        staff.get(reverse("admin:django_dbqueue_event_change", args=[good.id])).status_code == 200
    )


# -- stored schedule entries ----------------------------------------------------------------------


def test_a_stored_entry_python_cannot_read_is_left_out_alone_logged_and_shown(
    settings, staff, caplog
):
    settings.DBQUEUE = {**FAST, "SCHEDULE": {}}
    good = schedule_job("good-tick", "echo", every=1, payload={"n": 1})
    bad = schedule_job("bad-tick", "echo", every=1, payload={"n": 2})
    sql(f"UPDATE dbqueue_schedule_entry SET payload = {NESTED} WHERE id = %s", [bad.pk])
    # Both came due a minute ago.
    sql("UPDATE dbqueue_schedule_entry SET last_tick = now() - interval '1 minute'")
    scheduler = Scheduler()
    with caplog.at_level(logging.ERROR, logger="django_dbqueue"):
        counts = scheduler.run_once()
    assert counts["enqueued"] >= 1
    assert ScheduleEntry.objects.get(pk=good.pk).last_enqueued is not None
    assert (
        scalar("SELECT last_enqueued FROM dbqueue_schedule_entry WHERE id = %s", [bad.pk]) is None
    )
    ignored = [r.getMessage() for r in caplog.records if "'bad-tick' ignored" in r.getMessage()]
    assert len(ignored) == 1
    assert f"payload'] cannot be read back: nested {DEPTH} levels deep" in ignored[0]
    # A second pass: the good entry ticks on, the bad one is not parsed (nor logged) again.
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="django_dbqueue"):
        scheduler.run_once()
    assert not [r for r in caplog.records if "bad-tick" in r.getMessage()]
    # The status command's rows and the admin's list say why it is left out.
    rows = {row["name"]: row for row in status()}
    assert rows["good-tick"]["error"] is None
    assert "cannot be read back" in rows["bad-tick"]["error"]
    page = staff.get(reverse("admin:django_dbqueue_scheduleentry_changelist"))
    assert page.status_code == 200
    assert "ignored: schedule entry &#x27;bad-tick&#x27;[&#x27;payload&#x27;] cannot be read" in (
        page.content.decode()
    )


# -- the times of the other tables ----------------------------------------------------------------

# (table, column, a row of it to write): each holds only times Python reads back (migration
# 0027), so that the scheduler's one read of every entry, the metrics' one statement
# (now() - heartbeat_at) and the admin's pages never meet year 200000 or infinity.
ROWS = {
    "dbqueue_schedule_entry": (
        "INSERT INTO dbqueue_schedule_entry (name, job_type, cron, timezone, payload, queue,"
        " catch_up, misfire_grace, enabled, last_tick, created_at, updated_at)"
        " VALUES ('e', 'echo', '* * * * *', '', '{}', '', 'latest', 60, true, now(), now(), now())"
    ),
    "dbqueue_schedule": (
        "INSERT INTO dbqueue_schedule (name, last_tick, updated_at) VALUES ('s', now(), now())"
    ),
    "dbqueue_worker": (
        "INSERT INTO dbqueue_worker (worker_id, host, pid, version, queues, concurrency,"
        " execution, state, started_at, heartbeat_at, stale_at, expires_at, running)"
        " VALUES ('w', 'h', 1, 'v', '{default}', 1, 'threads', 'running', now(), now(), now(),"
        " now(), 0)"
    ),
    "dbqueue_queue": (
        "INSERT INTO dbqueue_queue (name, paused, changed_at, changed_by)"
        " VALUES ('default', true, now(), 'x')"
    ),
    "dbqueue_event": (
        "INSERT INTO dbqueue_event (name, payload, subscribers, published_at)"
        " VALUES ('e', '{}', '[]', now())"
    ),
}
COLUMNS = [
    ("dbqueue_schedule_entry", "last_tick"),
    ("dbqueue_schedule_entry", "last_enqueued"),
    ("dbqueue_schedule", "last_tick"),
    ("dbqueue_worker", "heartbeat_at"),
    ("dbqueue_worker", "stale_at"),
    ("dbqueue_queue", "changed_at"),
    ("dbqueue_event", "published_at"),
]


@pytest.mark.parametrize("value", ["infinity", "-infinity", "200000-01-01 00:00:00+00"])
@pytest.mark.parametrize(("table", "column"), COLUMNS)
def test_a_time_python_cannot_read_is_refused_by_the_tables_the_scheduler_and_metrics_read(
    table, column, value
):
    sql(ROWS[table])
    with pytest.raises(IntegrityError, match=f"{table}_{column}_range"), transaction.atomic():
        sql(f"UPDATE {table} SET {column} = %s::timestamptz", [value])


# -- a payload a worker read but cannot send to a handler process ---------------------------------


def _deep(levels):
    value = []
    for _ in range(levels):
        value = [value]
    return value


def test_a_payload_that_cannot_be_sent_to_the_handler_process_fails_that_job_dead(settings):
    """Python 3.13 reads a payload nested some 10,000 levels (the claim's slow path decodes it
    alone) that its json cannot write again inside the message to the child, one level deeper.
    Whatever the Python, a payload that json.dumps refuses is put on the claimed job here, as
    such a read leaves it; the other job of the claim runs in its child as usual."""
    settings.DBQUEUE = {**FAST, "EXECUTION": "process"}
    stuck, other = enqueue("echo", {"n": 1}).id, enqueue("echo", {"n": 2}).id
    worker = Worker(queues=["default"], concurrency=1, execution="process")
    try:
        worker.run_once()
        entries = {entry.ctx.id: entry for entry in worker.inflight.snapshot()}
        assert set(entries) == {stuck, other}
        entries[stuck].ctx.payload = _deep(100_000)
        with pytest.raises(RecursionError):
            json.dumps(entries[stuck].ctx.payload)
        worker.pool.start()
        wait_until(lambda: worker.acks.pending() >= 2, timeout=60, message="both outcomes")
        worker.acks.flush_once(worker.session)
    finally:
        worker.stop()
        worker.pool.stop(timeout=10)
        worker.session.close()
    row = job_row(stuck)
    assert (row["state"], row["attempts"]) == ("dead", 1)
    (error,) = row["errors"]
    assert error["class"] == "django_dbqueue.exceptions.UnreadableJob"
    assert error["message"].startswith(
        "payload: cannot be sent to the handler process as JSON (RecursionError"
    )
    assert error["worker"] == worker.worker_id
    assert (job_row(other)["state"], job_row(other)["result"]) == ("done", {"n": 2})


# -- django.tasks ---------------------------------------------------------------------------------


@pytest.mark.skipif(
    django.VERSION < (6, 0),
    reason="django.tasks exists from Django 6.0; the Django 6.1 run of the suite covers it",
)
@pytest.mark.parametrize(
    ("column", "value", "reason"),
    [
        ("result", DIGITS, "an integer of 5000 digits"),
        ("errors", f"jsonb_build_array({NESTED})", "levels deep"),
    ],
)
def test_a_task_result_python_cannot_read_raises_an_error_naming_the_job(column, value, reason):
    from django_dbqueue.exceptions import UnreadableJob
    from tests.testapp import tasks

    result = tasks.add.enqueue(2, 3)
    sql(
        f"UPDATE dbqueue_job SET state = 'done', attempts = 1, started_at = now(),"
        f" finished_at = now(), {column} = {value} WHERE id = %s",
        [int(result.id)],
    )
    with pytest.raises(UnreadableJob) as caught:
        tasks.add.get_result(result.id)
    assert str(caught.value).startswith(f"job #{result.id} {column}: ")
    assert reason in str(caught.value)
