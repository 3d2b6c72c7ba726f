"""A worker that listens for itself does it on its own session: one connection LISTENs and claims.

Against the real server: notifications that arrive while a statement runs and while the loop
sleeps on the socket, the wake-up flag that sleeps on both, and the worker's connections.
"""

import threading
import time

import psycopg
import pytest
from django.db import connection

from django_dbqueue import enqueue
from django_dbqueue.connections import Session, connection_params
from django_dbqueue.notifications import Wakeup
from tests.utils import scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

CHANNEL = "dbqueue_session_test"


@pytest.fixture
def session():
    woken = []
    s = Session("default", listen=CHANNEL, on_notify=lambda: woken.append(1))
    s.woken = woken
    yield s
    s.close()


def notify(payload):
    with psycopg.connect(**connection_params("default"), autocommit=True) as other:
        other.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload])


def test_a_notification_that_arrives_during_a_statement_is_queued(session):
    # The session notifies its own channel: the notification comes back with the statement's
    # results, and psycopg hands it over there.
    session.execute("SELECT pg_notify(%s, 'during')", [CHANNEL])
    assert list(session.notifies) == ["during"]
    assert session.woken == [1]
    assert session.listening.is_set()


def test_the_loop_sleeps_on_the_socket_and_reads_what_arrived(session):
    session.execute("SELECT 1", None)  # connected, LISTENing
    wakeup = Wakeup()
    try:
        fileno = session.listening_fileno()
        assert fileno is not None
        started = time.monotonic()
        assert wakeup.wait_on(fileno, 0.05) is False  # nothing came: the timeout
        assert time.monotonic() - started >= 0.04

        threading.Timer(0.05, notify, ["while idle"]).start()
        assert wakeup.wait_on(fileno, 10.0) is True  # the socket, long before the timeout
        wait_until(
            lambda: session.read_notifies() or list(session.notifies) == ["while idle"],
            message="the notification read from the socket",
        )
        assert session.woken == []  # read by the owner itself, not through a handler
    finally:
        wakeup.close()


def test_the_wakeup_flag_interrupts_the_sleep_from_another_thread(session):
    session.execute("SELECT 1", None)
    wakeup = Wakeup()
    try:
        fileno = session.listening_fileno()
        started = time.monotonic()
        threading.Timer(0.05, wakeup.set).start()
        assert wakeup.wait_on(fileno, 10.0) is False  # woken by the flag, not the socket
        # Asleep in poll() when the flag was set: its byte in the pipe woke it.
        assert 0.04 <= time.monotonic() - started < 5.0
        assert wakeup.is_set()
        wakeup.clear()
        assert not wakeup.is_set()
        started = time.monotonic()
        assert wakeup.wait_on(fileno, 0.05) is False
        assert time.monotonic() - started >= 0.04  # slept: clear() drained the pipe
    finally:
        wakeup.close()


def test_queued_notifications_keep_the_loop_awake(session):
    session.execute("SELECT pg_notify(%s, 'queued')", [CHANNEL])
    assert session.listening_fileno() is None  # something to act on: do not sleep


def test_a_lost_connection_is_raised_while_idle_and_the_next_connection_listens_again(session):
    session.execute("SELECT 1", None)
    pid = session.connection().info.backend_pid
    wakeup = Wakeup()
    try:
        fileno = session.listening_fileno()
        scalar("SELECT pg_terminate_backend(%s)", [pid])
        assert wakeup.wait_on(fileno, 10.0) is True
        with pytest.raises(psycopg.OperationalError):
            wait_until(lambda: session.read_notifies() and False, timeout=5, message="EOF")
    finally:
        wakeup.close()
    session.reset()
    assert not session.listening.is_set()
    session.execute("SELECT 1", None)  # reconnects, LISTENs again
    assert session.listening.is_set()
    notify("again")
    wait_until(
        lambda: session.read_notifies() or "again" in session.notifies,
        message="the notification on the new connection",
    )


QUIET = {"POLL_INTERVAL": 60, "HEARTBEAT_INTERVAL": 30, "SWEEP_INTERVAL": 30, "LEASE": 90}


def listening_sessions():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND (query LIKE 'LISTEN %%' OR application_name LIKE 'dbqueue %% (LISTEN %%') "
            "AND pid <> pg_backend_pid()"
        )
        return {pid for (pid,) in cursor.fetchall()}


def wait_listening(worker):
    wait_until(lambda: worker.listening is not None and worker.listening.is_set(), message="LISTEN")
    wait_until(lambda: worker.claims >= 1, message="the claim at start")
    return worker.session.conn.info.backend_pid


def wait_done_well_before_the_poll(job_id):
    started = time.monotonic()
    wait_until(
        lambda: scalar("SELECT state FROM dbqueue_job WHERE id = %s", [job_id]) == "done",
        timeout=5,
        message="the job, woken by its notification (the poll is 60 s away)",
    )
    return time.monotonic() - started


def test_a_worker_listens_and_claims_on_one_connection(start_worker, fast_settings):
    # Nothing else wakes the loop for half a minute: no poll, heartbeat or sweep.
    fast_settings.DBQUEUE = {**fast_settings.DBQUEUE, **QUIET}
    worker = start_worker()
    pid = wait_listening(worker)
    assert worker.listener is None  # no listener thread, no connection of its own
    assert listening_sessions() == {pid}  # the claim loop's own connection LISTENs
    claims = worker.claims
    wait_done_well_before_the_poll(enqueue("noop").id)
    assert worker.claims > claims  # the notification reached the loop, which claimed


def test_a_session_killed_while_the_loop_sleeps_listens_again_at_once(start_worker, fast_settings):
    # The loop sleeps on the session's socket: the end of the connection wakes it, and it
    # reconnects and LISTENs again without waiting for its 60 s poll.
    # Nothing else wakes the loop for half a minute: no poll, heartbeat or sweep.
    fast_settings.DBQUEUE = {**fast_settings.DBQUEUE, **QUIET}
    worker = start_worker()
    old = wait_listening(worker)
    wait_until(
        lambda: scalar("SELECT state FROM pg_stat_activity WHERE pid = %s", [old]) == "idle",
        message="the loop asleep",
    )
    assert scalar("SELECT pg_terminate_backend(%s)", [old])
    started = time.monotonic()
    wait_until(
        lambda: (new := listening_sessions()) and old not in new,
        timeout=10,
        message="a new listening session",
    )
    assert time.monotonic() - started < 5  # the loop noticed at once (its backoff: 0.2 s)
    assert wait_done_well_before_the_poll(enqueue("noop").id) < 5
