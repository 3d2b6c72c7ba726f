"""A worker that listens for itself does it on its own session: one connection LISTENs and claims.

Against the real server: notifications that arrive while a statement runs and while the loop
sleeps on the socket, the wake-up flag that sleeps on both, and the worker's connections.
"""

import threading
import time

import psycopg
import pytest

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
        threading.Timer(0.05, wakeup.set).start()
        started = time.monotonic()
        assert wakeup.wait_on(fileno, 10.0) is False  # woken by the flag, not the socket
        assert time.monotonic() - started < 5.0
        assert wakeup.is_set()
        wakeup.clear()
        assert not wakeup.is_set()
        assert wakeup.wait_on(fileno, 0.01) is False  # the pipe was drained by clear()
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


def test_a_worker_listens_and_claims_on_one_connection(start_worker, fast_settings):
    fast_settings.DBQUEUE = {**fast_settings.DBQUEUE, "POLL_INTERVAL": 60}
    worker = start_worker()
    wait_until(lambda: worker.listening is not None and worker.listening.is_set(), message="LISTEN")
    assert worker.listener is None  # no listener thread, no connection of its own
    pid = worker.session.conn.info.backend_pid
    listening = scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND (query LIKE 'LISTEN %%' OR application_name LIKE 'dbqueue worker (LISTEN %%') "
        "AND pid <> pg_backend_pid()"
    )
    assert listening == 1
    job = enqueue("noop")
    wait_until(lambda: scalar("SELECT state FROM dbqueue_job WHERE id = %s", [job.id]) == "done")
    # The backend that LISTENs is the one that ran the claim the notification caused.
    last = scalar("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid])
    assert "dbqueue_job" in last, last
