"""A second hostile review of the doors (docs/sql.md "Privileges", docs/concepts/security.md,
docs/admin.md "Rows Python cannot read", DESIGN.md "Trust boundaries"). Each finding is an
xfail(strict=True) test that asserts the promised behaviour: it passes once the finding is
fixed, and then the marker must go.

The hostile role is a role of its own, connected as itself (no SET ROLE), with LOGIN and nothing
else granted: what it does here needs no grant at all, so a producer with the documented grants
(EXECUTE on the dbqueue.* functions) can do it too.
"""

import contextlib
import hashlib

import psycopg
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.urls import reverse
from psycopg import sql as pgsql

from django_dbqueue import enqueue
from django_dbqueue.conf import get_settings
from django_dbqueue.connections import connection_params
from django_dbqueue.schedule_entries import schedule_job
from tests.poison import NESTED
from tests.utils import job_row, scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def sql(statement, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def _role():
    digest = hashlib.md5(connection.settings_dict["NAME"].encode()).hexdigest()[:10]
    return f"dbq_review2_nobody_{digest}"


@pytest.fixture
def nobody():
    """An autocommit session of a role with LOGIN and no grant at all."""
    owner = psycopg.connect(**connection_params("default"), autocommit=True)
    role = _role()
    password = hashlib.sha256(role.encode()).hexdigest()
    with contextlib.suppress(psycopg.Error):
        owner.execute(f"DROP OWNED BY {role} CASCADE")
    owner.execute(f"DROP ROLE IF EXISTS {role}")
    owner.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    session = psycopg.connect(
        **{**connection_params("default"), "user": role, "password": password}, autocommit=True
    )
    try:
        yield session
    finally:
        session.close()
        owner.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
        )
        owner.execute(f"DROP OWNED BY {role} CASCADE")
        owner.execute(f"DROP ROLE {role}")
        owner.close()


# -- finding A: any role that can connect cancels any running job with a NOTIFY ------------------


# DESIGN.md, Trust boundaries: whoever reaches the queue through one door gets no more than that
# door promises; docs/sql.md: a producer "cannot read or change a row ... change a job it did
# not add". The worker acts on a "cancel:<id>,..." payload on its wake-up channel
# (worker._on_notify -> cancel_requested -> inflight.cancel) without asking the database whether
# the job's cancel was asked for (cancel_requested_at). NOTIFY needs no privilege, the channel is
# the setting NOTIFY_CHANNEL ('dbqueue' by default) and job ids are a sequence (a producer learns
# the current one from its own enqueue), so any role that can connect, with no grant, stops
# other producers' running jobs: a cooperative handler raises JobCancelled, an async one's task
# is cancelled, a process-mode child is signalled, and a claimed job not yet started is withdrawn
# and written cancelled.
def test_a_role_with_no_grant_cannot_cancel_a_running_job_by_notify(start_worker, nobody):
    start_worker(concurrency=2)
    job = enqueue("cooperative", {"seconds": 1.5})
    wait_until(lambda: job_row(job.id)["state"] == "running", message="the handler to start")
    channel = get_settings().NOTIFY_CHANNEL
    nobody.execute(f"NOTIFY {pgsql.Identifier(channel).as_string(nobody)}, 'cancel:{job.id}'")
    wait_until(
        lambda: job_row(job.id)["state"] not in ("pending", "running"),
        timeout=15,
        message="the job to end",
    )
    row = job_row(job.id)
    # Nobody asked for its cancel: it runs to its end and succeeds.
    assert (row["state"], row["result"]) == ("done", {"finished": True})


# -- finding B: a stored schedule entry whose payload Python cannot read fails its own pages ------


@pytest.fixture
def staff(client):
    client.force_login(User.objects.create_superuser("boss", password="pw"))
    client.raise_request_exception = False  # a page that fails answers 500
    return client


# docs/admin.md, "Rows Python cannot read": "The pages never fail on it". The schedules' list
# defers the payload (admin/schedules.py get_queryset, after finding 4c of the first review), but
# an entry's change page, its delete page and its history page load it through the ORM, whose
# JSONField decode raises RecursionError for a payload nested deeper than Python's json reads:
# a 500 for every staff user, and the entry cannot be edited or deleted from its page. (A
# payload with a 5000-digit integer is caught by the admin's get_object as a ValueError and
# answered with a redirect: "doesn't exist. Perhaps it was deleted?", which is no 500 but
# misleading.)
def test_a_schedule_entrys_pages_answer_around_a_payload_python_cannot_read(staff):
    schedule_job("broken", "noop", every=3600)
    sql(f"UPDATE dbqueue_schedule_entry SET payload = {NESTED} WHERE name = 'broken'")
    entry = scalar("SELECT id FROM dbqueue_schedule_entry WHERE name = 'broken'")
    assert staff.get(reverse("admin:django_dbqueue_scheduleentry_changelist")).status_code == 200
    codes = {
        page: staff.get(
            reverse(f"admin:django_dbqueue_scheduleentry_{page}", args=[entry])
        ).status_code
        for page in ("change", "delete", "history")
    }
    assert codes == {"change": 200, "delete": 200, "history": 200}
    # The change page shows the entry read-only, its payload as the stored text with the reason.
    page = staff.get(reverse("admin:django_dbqueue_scheduleentry_change", args=[entry]))
    text = page.content.decode()
    assert "unreadable: nested" in text and "Save" not in text
    # A payload Python's int() refuses (more than 4300 digits) is no "doesn't exist" either.
    schedule_job("digits", "noop", every=3600)
    sql("UPDATE dbqueue_schedule_entry SET payload = %s::jsonb WHERE name = 'digits'", ["9" * 5000])
    digits = scalar("SELECT id FROM dbqueue_schedule_entry WHERE name = 'digits'")
    page = staff.get(reverse("admin:django_dbqueue_scheduleentry_change", args=[digits]))
    assert page.status_code == 200 and "unreadable: " in page.content.decode()
    # And the entry can be deleted from its page.
    deleted = staff.post(
        reverse("admin:django_dbqueue_scheduleentry_delete", args=[entry]), {"post": "yes"}
    )
    assert deleted.status_code == 302
    assert scalar("SELECT count(*) FROM dbqueue_schedule_entry WHERE name = 'broken'") == 0


# -- finding C: any role that can connect stops every listening worker with one NOTIFY ------------


# The wake-up payload is '<count>:<queue>' (notifications.parse_wakeup): the count is read with
# int() once it is ASCII digits, and Python refuses to convert a str of more than 4300 digits
# (sys.get_int_max_str_digits) with ValueError. A NOTIFY payload holds up to 8000 bytes, so
# '<5000 nines>:default' raises in the listener's notify handler; the listener takes that for a
# bug ("dbqueue listener crashed") and the worker gives up (on_crash -> fatal). NOTIFY needs no
# privilege: any role that can connect stops every worker that listens on the channel, as often
# as they are restarted. (Measured: with the worker listening on its own session, the ValueError
# is raised out of Worker.run() itself, from _take_notifies -> _on_notify -> parse_wakeup, and
# the worker's thread dies with a traceback; a --processes group listener crashes and gives up.)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_role_with_no_grant_cannot_stop_a_worker_by_notify(start_worker, nobody):
    worker = start_worker()
    wait_until(
        lambda: worker.listening is not None and worker.listening.is_set(),
        message="the worker to listen",
    )
    channel = pgsql.Identifier(get_settings().NOTIFY_CHANNEL).as_string(nobody)
    nobody.execute(f"NOTIFY {channel}, '{'9' * 5000}:default'")
    # The job's wake-up is delivered after that notification, on the same channel: once the
    # job is done, the worker has read both.
    job = enqueue("noop")
    wait_until(lambda: job_row(job.id)["state"] == "done", message="the job to run")
    assert worker.thread.is_alive() and worker.result == {}


# -- findings D, E, F: timestamps of the tables 0027 left unbounded fail pages for everyone -------


# DESIGN.md, Trust boundaries: "The database bounds what a row may hold (CHECKs on every
# timestamp and lease), so what another door writes is what Python reads"; docs/admin.md: "The
# pages never fail on it". Migration 0027 bounds dbqueue_job and OTHER_TABLES (events, workers,
# paused queues, the schedules' state and entries), but not dbqueue_limiter.starts/updated_at,
# dbqueue_depth.minute, dbqueue_finished.minute, dbqueue_delivery.created_at/updated_at,
# dbqueue_signal.created_at nor dbqueue_step.finished_at. Of those, measured:
#  D. dbqueue_limiter.starts holding 'infinity' or year 200000: store.rate_window returns a reopen
#     time psycopg cannot load (DataError), so the queues' admin page answers 500 and
#     jobqueue_status (text and --json) ends in a traceback, for everyone, while the row stays.
#     (The claims go on; but such a start counts in the window for ever: with limit 1 the queue
#     never runs again.)
#  E. dbqueue_depth.minute = 'infinity': the dashboard answers 500.
#  F. dbqueue_delivery.created_at/updated_at = -infinity/infinity: the deliveries list and the
#     delivery's page answer 500.
# A table CHECK (as 0027 adds elsewhere) or reads that cope, as the job pages do, would hold them.


@pytest.fixture
def rate_limited(settings):
    from tests.integration.conftest import FAST

    settings.DBQUEUE = {
        **FAST,
        "QUEUES": {"default": {}, "limited": {"rate_limit": {"limit": 1, "period": 60}}},
    }


# Held since migration 0030: each table refuses such a time, naming the constraint
# ({table}_{column}_range; every element of dbqueue_limiter.starts), and a row at the bounds,
# which is what 0030's repair leaves of an old bad one, fails no page.


def _refused(statement, constraint):
    from django.db import IntegrityError

    with pytest.raises(IntegrityError, match=constraint):
        sql(statement)


def test_a_limiter_start_python_cannot_read_is_refused_or_answered_around(rate_limited, staff):
    import io
    import json

    from django.core.management import call_command

    insert = (
        "INSERT INTO dbqueue_limiter (scope, name, part, starts, updated_at)"
        " VALUES ('queue', 'limited', '', %s, %s)"
    )
    for starts in ("{infinity}", "{-infinity}", "{200000-01-01 00:00:00+00}"):
        _refused(insert % (f"'{starts}'", "now()"), "dbqueue_limiter_starts_range")
    _refused(insert % ("'{}'", "'infinity'"), "dbqueue_limiter_updated_at_range")
    # A window with a start at each bound (what 0030's repair leaves of none: it removes the
    # starts out of bounds) and one now, updated at the upper bound.
    sql(
        insert
        % (
            "ARRAY['0001-01-02 00:00:00+00'::timestamptz, now(), '9999-12-30 00:00:00+00']",
            "'9999-12-30 00:00:00+00'",
        )
    )
    assert staff.get(reverse("admin:django_dbqueue_queuestate_changelist")).status_code == 200
    call_command("jobqueue_status", stdout=io.StringIO())
    out = io.StringIO()
    call_command("jobqueue_status", "--json", stdout=out)
    json.loads(out.getvalue())


def test_a_depth_minute_python_cannot_read_is_refused_or_answered_around(staff):
    for value in ("infinity", "-infinity", "200000-01-01 00:00:00+00"):
        _refused(
            "INSERT INTO dbqueue_depth (minute, queue, due, scheduled, running)"
            f" VALUES ('{value}', 'default', 1, 0, 0)",
            "dbqueue_depth_minute_range",
        )
        _refused(
            "INSERT INTO dbqueue_finished (minute, queue, type, done, dead, cancelled,"
            f" failed_attempts, wait_histogram) VALUES ('{value}', 'default', 'noop', 1, 0, 0,"
            " 0, '{}')",
            "dbqueue_finished_minute_range",
        )
    for value in ("0001-01-02 00:00:00+00", "9999-12-30 00:00:00+00"):
        sql(
            "INSERT INTO dbqueue_depth (minute, queue, due, scheduled, running)"
            f" VALUES ('{value}', 'default', 1, 0, 0)"
        )
        sql(
            "INSERT INTO dbqueue_finished (minute, queue, type, done, dead, cancelled,"
            f" failed_attempts, wait_histogram) VALUES ('{value}', 'default', 'noop', 1, 0, 0,"
            " 0, '{}')"
        )
    assert staff.get(reverse("admin:django_dbqueue_dashboard")).status_code == 200


def test_a_delivery_time_python_cannot_read_is_refused_or_answered_around(staff):
    insert = (
        "INSERT INTO dbqueue_delivery (key, state, attempt, provider_reference, error,"
        " created_at, updated_at) VALUES ('k', 'recorded', 0, '', '', '{}', '{}')"
    )
    _refused(insert.format("-infinity", "now"), "dbqueue_delivery_created_at_range")
    _refused(insert.format("now", "infinity"), "dbqueue_delivery_updated_at_range")
    sql(insert.format("0001-01-02 00:00:00+00", "9999-12-30 00:00:00+00"))
    delivery = scalar("SELECT id FROM dbqueue_delivery WHERE key = 'k'")
    codes = {
        "list": staff.get(reverse("admin:django_dbqueue_jobdelivery_changelist")).status_code,
        "change": staff.get(
            reverse("admin:django_dbqueue_jobdelivery_change", args=[delivery])
        ).status_code,
    }
    assert codes == {"list": 200, "change": 200}


# -- finding G: any role that can connect stops every claim of a limited queue with a lock ---------


# A claim of a worker whose queues (or types) carry a global_concurrency or an unkeyed
# rate_limit runs dbqueue_claim_within_limits(), which first takes, blocking,
# pg_advisory_xact_lock(dbqueue_limiter_lock(scope, name, '')) of each such limiter (migration
# 0026, step (a)). The key is public arithmetic: hashtextextended('dbqueue limiter' || chr(31) ||
# scope || chr(31) || name || chr(31) || '', 0). Advisory locks need no privilege, so any role
# that can connect takes that key with pg_advisory_lock() in an idle session and holds it: every
# worker's claim then waited on it for ever (the claim has no lock_timeout), and the worker claimed
# nothing, not even the jobs of its other, unlimited queues, until that session ended. Migration
# 0028 waits for it at most 200 ms; the limiter's row lock decides past that.
def test_a_role_with_no_grant_cannot_stop_the_claims_with_an_advisory_lock(
    start_worker, settings, nobody
):
    from tests.integration.conftest import FAST

    settings.DBQUEUE = {
        **FAST,
        "QUEUES": {"default": {}, "limited": {"rate_limit": {"limit": 100, "period": 1}}},
    }
    nobody.execute(
        "SELECT pg_advisory_lock(hashtextextended('dbqueue limiter' || chr(31) || 'queue'"
        " || chr(31) || 'limited' || chr(31) || '', 0))"
    )
    start_worker()
    jobs = [enqueue("noop", queue=queue).id for queue in ("default", "limited")]
    wait_until(
        lambda: [job_row(i)["state"] for i in jobs] == ["done", "done"],
        timeout=15.0,
        message="the jobs of both queues done while another session holds the limiter's lock",
    )


# -- finding H: any role that can connect starves a serial key with a lock -------------------------


# dbqueue_serial_turn() (migration 0026) gives a serial key's next job its turn only if
# pg_try_advisory_xact_lock(hashtextextended('dbqueue serial key' || chr(31) || key, 0))
# succeeds. The key is public arithmetic and advisory locks need no privilege: a role with no
# grant that holds that lock in an idle session keeps every job of the serial key pending for as
# long as it likes (a producer's serial keys are often guessable: 'account:<id>'). A producer
# with the documented grant can already queue ahead of a key's jobs (docs/sql.md); this needs no
# grant at all.
@pytest.mark.xfail(
    strict=True,
    reason="finding H (known, documented in docs/concepts/security.md: grant CONNECT only to "
    "roles trusted that far): a session-level advisory lock on a serial key's lock key, which "
    "any role may take, keeps the key's jobs pending while it is held",
)
def test_a_role_with_no_grant_cannot_starve_a_serial_key_with_an_advisory_lock(
    start_worker, nobody
):
    nobody.execute(
        "SELECT pg_advisory_lock(hashtextextended('dbqueue serial key' || chr(31) || 'acct:7', 0))"
    )
    start_worker()
    job = enqueue("noop", serial_key="acct:7")
    wait_until(
        lambda: job_row(job.id)["state"] == "done",
        timeout=5.0,
        message="the serial key's job done while another session holds the key's lock",
    )
