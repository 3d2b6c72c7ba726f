"""The admin and the commands render around rows Python cannot read (docs/admin.md): a job
written by direct SQL with run_after, created_at, started_at, finished_at or leased_until of year
200000 or 4000 BC (and a payload, result or error history Python's json refuses). Before, the
ORM's read of such a row raised DataError: the job list was a 500 for everyone while the row was
on its page, so was the job's page, and ``jobqueue_status --job`` ended in a traceback. Now every
page answers 200, shows the value as PostgreSQL writes it, marked, and the rest as usual."""

import io
import json

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.urls import reverse

from django_dbqueue import enqueue, publish
from tests.poison import DEPTH, NESTED, unbounded

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _unbounded(transactional_db):
    """The timestamps written here are refused by the table since migration 0027
    (test_bounded_rows.py): its CHECKs are dropped for each test, as an owner of the table could
    drop them, to hold the worker and the admin to coping with such rows all the same."""
    with unbounded():
        yield


CHANGELIST = "admin:django_dbqueue_backgroundjob_changelist"
CHANGE = "admin:django_dbqueue_backgroundjob_change"
DEAD_LIST = "admin:django_dbqueue_deadletter_changelist"
DEAD_CHANGE = "admin:django_dbqueue_deadletter_change"
DIGITS = """('{"a":' || repeat('9', 5000) || '}')::jsonb"""


def sql(statement, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_superuser("boss", password="pw"))
    return client


@pytest.fixture
def rows():
    """One job per unreadable column, and a readable one beside them."""
    made = {
        name: enqueue("noop").id for name in ("ok", "run_after", "pending_bc", "dead", "running")
    }
    sql(
        "UPDATE dbqueue_job SET run_after = '200000-01-01 00:00:00+00' WHERE id = %s",
        [made["run_after"]],
    )
    sql(
        "UPDATE dbqueue_job SET run_after = '4000-01-01 00:00:00+00 BC', "
        "created_at = '4000-06-01 00:00:00+00 BC' WHERE id = %s",
        [made["pending_bc"]],
    )
    sql(
        f"""UPDATE dbqueue_job SET state = 'dead', attempts = 1,
               finished_at = '200000-01-01 00:00:00+00', started_at = '4000-01-01 00:00:00+00 BC',
               created_at = '4000-01-01 00:00:00+00 BC', payload = {DIGITS}, result = {DIGITS},
               errors = jsonb_build_array(jsonb_build_object(
                   'attempt', 1, 'class', 'Boom', 'message', 'it broke', 'deep',
                   {NESTED}))
           WHERE id = %s""",
        [made["dead"]],
    )
    sql(
        "UPDATE dbqueue_job SET state = 'running', attempts = 1, worker_id = 'w1', "
        "lease_token = 7, started_at = now(), leased_until = '200000-01-01 00:00:00+00', "
        "cancel_requested_at = '4000-01-01 00:00:00+00 BC' WHERE id = %s",
        [made["running"]],
    )
    return made


def page(client, url, *args, query=""):
    response = client.get(reverse(url, args=args) + query)
    assert response.status_code == 200, response.content[:2000]
    return response.content.decode()


@pytest.mark.parametrize("query", ["", "?o=6", "?o=-7", "?state__exact=dead", "?stuck=yes"])
def test_the_job_list_shows_every_row_and_the_unreadable_values_as_text(staff, rows, query):
    html = page(staff, CHANGELIST, query=query)
    if not query:
        for job_id in rows.values():
            assert f"/{job_id}/change/" in html
        assert "200000-01-01 00:00:00+00 (out of range)" in html
        assert "4000-01-01 00:00:00+00 BC (out of range)" in html
        assert "Boom: it broke" in html  # the last error, read as text


def test_each_jobs_page_answers_and_shows_what_it_cannot_read(staff, rows):
    html = page(staff, CHANGE, rows["run_after"])
    assert "200000-01-01 00:00:00+00 (out of range)" in html
    html = page(staff, CHANGE, rows["pending_bc"])
    assert "4000-01-01 00:00:00+00 BC (out of range)" in html
    assert "4000-06-01 00:00:00+00 BC (out of range)" in html
    html = page(staff, CHANGE, rows["dead"])
    assert "200000-01-01 00:00:00+00 (out of range)" in html  # finished_at
    assert "unreadable: an integer of 5000 digits, more than Python reads (4300)" in html
    assert f"unreadable: nested {DEPTH + 2} levels deep" in html  # the error history, in its list
    html = page(staff, CHANGE, rows["running"])
    assert html.count("(out of range)") == 2  # leased_until, cancel_requested_at
    html = page(staff, CHANGE, rows["ok"])
    assert "(out of range)" not in html and "unreadable" not in html


def test_the_dead_letters_and_the_dashboard_answer(staff, rows):
    html = page(staff, DEAD_LIST)
    assert f"/{rows['dead']}/change/" in html
    assert "200000-01-01 00:00:00+00 (out of range)" in html
    page(staff, DEAD_LIST, query="?o=5")  # by finished_at
    page(staff, DEAD_CHANGE, rows["dead"])
    page(staff, "admin:django_dbqueue_dashboard")


def test_the_events_and_workers_pages_answer_around_such_jobs(staff, rows):
    event = publish("test.invoice.paid", {"invoice": 1})
    made = event.jobs[0]
    sql(
        "UPDATE dbqueue_job SET run_after = '4000-01-01 00:00:00+00 BC', "
        "created_at = '200000-01-01 00:00:00+00' WHERE id = %s",
        [made.id],
    )
    page(staff, "admin:django_dbqueue_event_changelist")
    assert f"/{made.id}/change/" in page(staff, "admin:django_dbqueue_event_change", event.id)
    assert "event" in page(staff, CHANGE, made.id)  # the job's page links its event
    page(staff, "admin:django_dbqueue_workerrecord_changelist")


def test_the_changelist_reads_no_row_twice(staff, rows, django_assert_max_num_queries):
    """The unreadable values come in the list's own query (annotations), not one per row."""
    sql(
        """INSERT INTO dbqueue_job (type, queue, payload, state, priority, run_after, attempts,
           max_attempts, lease_seconds, errors, created_at)
           SELECT 'noop', 'default', '{}', 'pending', 0, '4000-01-01 00:00:00+00 BC', 0, 10, 60,
                  '[{"class": "E", "message": "m"}]', '200000-01-01 00:00:00+00'
           FROM generate_series(1, 200)"""
    )
    with django_assert_max_num_queries(12):
        page(staff, CHANGELIST)


def status(*args):
    out, err = io.StringIO(), io.StringIO()
    call_command("jobqueue_status", *args, stdout=out, stderr=err)
    return out.getvalue()


def test_jobqueue_status_prints_a_job_it_cannot_read(rows):
    text = status("--job", str(rows["pending_bc"]))
    assert "run after: 4000-01-01 00:00:00+00 BC (out of range)" in text
    text = status("--job", str(rows["run_after"]))
    assert "run after: 200000-01-01 00:00:00+00 (out of range)" in text
    text = status("--job", str(rows["dead"]))
    assert f"last error: unreadable: nested {DEPTH + 1} levels deep" in text
    data = json.loads(status("--job", str(rows["pending_bc"]), "--json"))
    assert data["run_after"] == "4000-01-01 00:00:00+00 BC (out of range)"
    data = json.loads(status("--job", str(rows["dead"]), "--json"))
    assert data["last_error"].startswith(f"unreadable: nested {DEPTH + 1} levels deep")
    assert "pending" in status()  # the queue's summary around them


def test_a_step_record_python_cannot_read_is_shown_on_the_page_and_by_the_command(staff, rows):
    sql(
        f"INSERT INTO dbqueue_step (job_id, name, occurrence, attempt, result, finished_at) "
        f"VALUES (%s, 'charge', 1, 1, {DIGITS}, '200000-01-01 00:00:00+00')",
        [rows["dead"]],
    )
    html = page(staff, CHANGE, rows["dead"])
    assert "charge" in html and html.count("200000-01-01 00:00:00+00 (out of range)") == 2
    text = status("--job", str(rows["dead"]))
    assert "finished 200000-01-01 00:00:00+00 (out of range)" in text
    (step,) = json.loads(status("--job", str(rows["dead"]), "--json"))["steps"]
    assert step["finished_at"] == "200000-01-01 00:00:00+00 (out of range)"
    assert step["result"] == "unreadable: an integer of 5000 digits, more than Python reads (4300)"
