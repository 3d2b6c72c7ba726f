"""The worker registry's statements (presence.py), on real sessions.

The one race: a worker's heartbeat refreshing its row while another worker's sweeper deletes
the rows past their expiry (a worker that was stalled past its expiry and comes back). Both
orders are held open with a transaction left open on a psycopg connection; the second statement
is seen waiting in pg_blocking_pids before the first commits. Either way the worker ends listed.
"""

import threading

import psycopg
import pytest
from django.db import connection

from django_dbqueue import presence, store
from django_dbqueue.connections import connection_params
from django_dbqueue.worker import Worker
from tests.utils import scalar, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


class Raw:
    """A psycopg connection as ``store``'s ``db`` argument (like a worker's Session)."""

    def __init__(self, conn):
        self.conn = conn

    def execute(self, statement, params):
        cursor = self.conn.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def announce(db, worker="host:1:abc"):
    store.announce_worker(
        db,
        worker=worker,
        host="host",
        pid=1,
        version="v",
        queues=["default", "emails"],
        concurrency=4,
        execution="thread",
        group_pid=None,
        state="running",
        stale=20,
        expire=30,
        running=0,
    )


def make_expired(worker="host:1:abc"):
    announce("default", worker)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_worker SET heartbeat_at = now() - interval '1 minute', "
            "stale_at = now() - interval '40 seconds', expires_at = now() - interval '30 seconds'"
        )
    assert presence.live_workers() == []


def blocked_on(pid, blocker_pid):
    return blocker_pid in scalar("SELECT pg_blocking_pids(%s)", [pid])


def in_thread(func):
    result = {}

    def run():
        try:
            result["value"] = func()
        except BaseException as exc:  # pragma: no cover - reported by the assertion below
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


@pytest.mark.parametrize("first", ["heartbeat", "sweep"])
def test_a_heartbeat_and_a_sweep_of_its_expired_row_leave_the_worker_listed(first):
    make_expired()
    with (
        psycopg.connect(**connection_params("default")) as held,
        psycopg.connect(**connection_params("default"), autocommit=True) as other,
    ):
        other_pid = other.info.backend_pid
        if first == "heartbeat":
            announce(Raw(held))  # uncommitted: the row is fresh in this transaction only
            thread, result = in_thread(lambda: store.forget_expired_workers(Raw(other)))
        else:
            assert [w for w, _ in store.forget_expired_workers(Raw(held))] == ["host:1:abc"]
            thread, result = in_thread(lambda: announce(Raw(other)))
        wait_until(
            lambda: blocked_on(other_pid, held.info.backend_pid),
            timeout=5,
            message="the second statement to wait for the first",
        )
        held.commit()
        thread.join(10)
    assert "error" not in result, result
    if first == "heartbeat":
        # The sweep re-read the row it waited for: refreshed, so not expired, so kept.
        assert result["value"] == []
    [live] = presence.live_workers()
    assert (live.worker_id, live.stale, live.queues) == ("host:1:abc", False, ["default", "emails"])


def test_the_row_is_one_statement_on_the_workers_own_session_at_the_heartbeat():
    worker = Worker(queues=["default"], concurrency=3, listen=False)
    try:
        before = worker.session.statements
        worker.presence.announce_once(worker.session)
        assert worker.session.statements == before + 1
        [live] = presence.live_workers()
        assert (live.worker_id, live.concurrency, live.execution, live.state) == (
            worker.worker_id,
            3,
            "thread",
            "running",
        )
        # The loop's maintenance refreshes it at the heartbeat's wake-up, not on a timer of its
        # own: after a turn, both are next due at the same instant.
        worker.maintenance.run_due()
        assert worker.maintenance.next["presence"] == worker.maintenance.next["beat"]
        worker.stopping.set()
        worker.presence.announce_once(worker.session)
        assert presence.live_workers()[0].state == "stopping"
        worker.presence.withdraw(worker.session)
        assert presence.live_workers() == []
    finally:
        worker.session.close()


def test_deadlines_count_heartbeats_with_a_floor():
    assert (presence.stale_after(10.0), presence.expire_after(10.0)) == (20.0, 30.0)
    assert (presence.stale_after(0.25), presence.expire_after(0.25)) == (5.0, 10.0)
