"""After a lost connection, the worker hands back jobs it holds without knowing (a claim whose
reply was lost). Its old backend may still be running that claim: the release must see how it
ended, in both orders (docs/deployment.md, "Database faults").

The claim is held open at its exact point: a test-only statement trigger on the job table makes
a claim by the worker's first session (only it sets ``dbqueue_test.hold_claim``) wait, after its
UPDATE and before its commit, for an advisory lock the test holds. The test then cuts the
worker's end of the connection, as a network fault or a client timeout does, while the backend
goes on waiting.
"""

import os
import socket
import threading

import pytest
from django.db import connection

from django_dbqueue import enqueue
from django_dbqueue.connections import DB_ERRORS, connect
from django_dbqueue.worker import Worker
from tests.utils import job_row, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

LOCK = 25_001


@pytest.fixture
def claim_hook():
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            CREATE FUNCTION dbqueue_test_hold_claim() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF current_setting('dbqueue_test.hold_claim', true) = 'on' THEN
                    PERFORM pg_advisory_xact_lock_shared({LOCK});
                END IF;
                RETURN NULL;
            END $$
            """
        )
        cursor.execute(
            "CREATE TRIGGER dbqueue_test_hold_claim AFTER UPDATE ON dbqueue_job "
            "FOR EACH STATEMENT EXECUTE FUNCTION dbqueue_test_hold_claim()"
        )
    yield
    with connection.cursor() as cursor:
        cursor.execute("DROP TRIGGER dbqueue_test_hold_claim ON dbqueue_job")
        cursor.execute("DROP FUNCTION dbqueue_test_hold_claim()")


@pytest.fixture
def admin():
    conn = connect("default")
    yield conn
    conn.close()


def backend_gone(admin, pid):
    return admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone() is None


def claim_then_lose_the_connection(worker, admin):
    """The worker's claim runs on its backend, which waits in the trigger; then the worker's
    end of the connection is cut. Returns the old backend's pid, still waiting, uncommitted."""
    worker.session.connection().execute("SET dbqueue_test.hold_claim TO 'on'", prepare=False)
    old_pid = worker.session.conn.info.backend_pid
    errors = []

    def claim():
        try:
            worker.run_once()
        except DB_ERRORS as exc:
            errors.append(exc)
            worker._lost_connection()  # as the loop does

    thread = threading.Thread(target=claim)
    thread.start()
    wait_until(
        lambda: admin.execute(
            "SELECT 1 FROM pg_locks WHERE pid = %s AND locktype = 'advisory' AND NOT granted",
            [old_pid],
        ).fetchone(),
        message="the claim waiting in the trigger",
    )
    cut = socket.socket(fileno=os.dup(worker.session.conn.pgconn.socket))
    cut.shutdown(socket.SHUT_RDWR)
    cut.close()
    thread.join(30)
    assert not thread.is_alive() and errors, "the worker saw its connection lost"
    assert not backend_gone(admin, old_pid), "the old backend still runs the claim"
    return old_pid


@pytest.fixture
def worker(fast_settings):
    worker = Worker(concurrency=2, listen=False)  # its pool is not started: nothing runs
    yield worker
    worker.session.close()


def held_by(worker, ids):
    return [
        (row["state"], row["attempts"], row["worker_id"] == worker.worker_id)
        for row in map(job_row, ids)
    ]


def test_a_claim_still_running_on_the_lost_backend_is_ended_before_the_release(
    claim_hook, admin, worker
):
    ids = [enqueue("noop").id, enqueue("noop").id]
    holder = connect("default", autocommit=False)
    holder.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK])
    try:
        old_pid = claim_then_lose_the_connection(worker, admin)
        # The worker is back and releases what it holds without knowing, while its old
        # backend's claim has not committed yet.
        released = worker._recover()
    finally:
        holder.rollback()  # the claim may go on now, if its backend is still there
        holder.close()
    wait_until(lambda: backend_gone(admin, old_pid), message="the old backend gone")
    # Nothing stays claimed by a worker that does not know it: no lease to sit out.
    assert held_by(worker, ids) == [("pending", 0, False)] * 2
    assert released == set()


def test_a_claim_the_lost_backend_committed_first_is_released(claim_hook, admin, worker):
    ids = [enqueue("noop").id, enqueue("noop").id]
    holder = connect("default", autocommit=False)
    holder.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK])
    try:
        old_pid = claim_then_lose_the_connection(worker, admin)
    finally:
        holder.rollback()  # the other order: the claim commits before the worker is back
        holder.close()
    wait_until(lambda: backend_gone(admin, old_pid), message="the old backend gone")
    assert held_by(worker, ids) == [("running", 1, True)] * 2
    assert worker._recover() == set(ids)
    assert held_by(worker, ids) == [("pending", 0, False)] * 2
