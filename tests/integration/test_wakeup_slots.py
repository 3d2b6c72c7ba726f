"""Wake-ups that name their workers (waiters.py, migration 0014), against the real server: the
slots a waiting worker takes, the payload the sender's statement makes from them, and in-process
workers that leave a wake-up to the workers it names."""

import psycopg
import pytest
from django.db import connection

from django_dbqueue import enqueue, sql
from django_dbqueue.connections import connection_params
from tests.utils import Listener, scalar, wait_until, wakeup_slots

pytestmark = pytest.mark.django_db(transaction=True)


def direct():
    return psycopg.connect(**connection_params("default"), autocommit=True)


def take(conn, queues, channel="dbqueue"):
    """``{queue: slot}`` taken on ``conn`` (sql.TAKE_SLOTS, as store.take_slots runs it)."""
    slots = conn.execute(sql.TAKE_SLOTS, {"channel": channel, "queues": queues}).fetchone()[0]
    return dict(zip(queues, slots, strict=True))


def named(payload, channel="dbqueue"):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT dbqueue_wakeup_payload(%s, %s, %s)", [channel, payload, sql.WAKEUP_SLOTS]
        )
        return cursor.fetchone()[0]


def test_the_migration_and_sql_agree_on_the_slot_lock():
    migration = __import__("django_dbqueue.migrations.0014_wakeup_slots", fromlist=["SLOT_LOCK"])
    assert migration.SLOT_LOCK == sql.SLOT_LOCK


def test_waiters_take_the_lowest_free_slots_and_lose_them_with_their_connection():
    a, b, c = direct(), direct(), direct()
    try:
        assert take(a, ["default", "emails"]) == {"default": 0, "emails": 0}
        assert take(b, ["default"]) == {"default": 1}
        assert wakeup_slots() == {0: a.info.backend_pid, 1: b.info.backend_pid}
        assert wakeup_slots("emails") == {0: a.info.backend_pid}
        a.execute(sql.STOP_WAITING)  # a full claim: it stops waiting, its slots go
        assert wakeup_slots() == {1: b.info.backend_pid}
        assert take(c, ["default"]) == {"default": 0}, "the lowest free one"
        c.close()
        wait_until(lambda: wakeup_slots() == {1: b.info.backend_pid}, message="c's slot gone")
        # Another channel's slots are its own: a project sharing the database and the queue
        # name holds none of ours.
        assert take(a, ["default"], channel="other") == {"default": 0}
        assert wakeup_slots() == {1: b.info.backend_pid}
        assert wakeup_slots(channel="other") == {0: a.info.backend_pid}
    finally:
        for conn in (a, b, c):
            conn.close()


def test_every_slot_taken_leaves_a_waiter_without_one():
    conns = [direct() for _ in range(4)]
    try:
        got = [
            conn.execute("SELECT dbqueue_take_slots('dbqueue', ARRAY['default'], 3)").fetchone()[0]
            for conn in conns
        ]
        assert got == [[0], [1], [2], [None]]
    finally:
        for conn in conns:
            conn.close()


def test_the_sender_stops_at_a_run_of_free_slots():
    conns = [direct() for _ in range(6)]
    try:
        for conn in conns:
            take(conn, ["default"])
        for conn in conns[:5]:
            conn.execute(sql.STOP_WAITING)  # slots 0..4 free, 5 held
        assert named("1:default") == "1:default", "four free in a row: it stopped, names nobody"
        conns[0].close()
        conns[0] = direct()
        take(conns[0], ["default"])  # slot 0 again: 1..4 free
        assert named("1:default") == "1/0:default", "slot 5 is past the run of free ones"
    finally:
        for conn in conns:
            conn.close()


def test_the_payload_names_the_lowest_held_slots_one_more_than_its_jobs():
    conns = [direct() for _ in range(4)]
    try:
        assert named("1:default") == "1:default", "no slot held: nobody named, everyone acts"
        for conn in conns:
            take(conn, ["default"])
        conns[0].execute(sql.STOP_WAITING)  # slot 0 free again: 1, 2, 3 held
        assert named("1:default") == "1/1.2:default"
        assert named("2:default") == "2/1.2.3:default"
        assert named("9:default") == "9/1.2.3:default", "as many as are held"
        assert named("1:emails") == "1:emails", "another queue's slots"
        assert named("1:default", channel="other") == "1:default", "another channel's"
        # What is not a count of jobs comes back as it was.
        for payload in ("default", "cancel:1,2", "x:default", "1", "1/2:default"):
            assert named(payload) == payload
        # The probe lets go of the free slots it tried: nothing is left held by this session.
        assert wakeup_slots() == {s: conns[s].info.backend_pid for s in (1, 2, 3)}
    finally:
        for conn in conns:
            conn.close()


def test_an_enqueue_wakes_with_a_payload_naming_the_waiting_workers(slow_poll_settings):
    listen = Listener(waits=False)
    holders = [direct() for _ in range(2)]
    try:
        for conn in holders:
            take(conn, ["default"])
        waiting = Listener()  # says it waits (no slot): the enqueue wakes
        try:
            enqueue("noop")
            assert listen.until_jobs(1) == ["1/0.1:default"]
        finally:
            waiting.close()
    finally:
        listen.close()
        for conn in holders:
            conn.close()


def test_wakeup_if_waiting_false_names_nobody(settings):
    settings.DBQUEUE = {**settings.DBQUEUE, "WAKEUP_IF_WAITING": False}
    listen = Listener(waits=False)
    holder = direct()
    try:
        take(holder, ["default"])
        enqueue("noop")
        assert listen.until_jobs(1) == ["1:default"], "the payload earlier releases read"
    finally:
        listen.close()
        holder.close()


# In-process workers ---------------------------------------------------------------------------


@pytest.fixture
def slow_poll_settings(settings, fast_settings):
    settings.DBQUEUE = {**settings.DBQUEUE, "POLL_INTERVAL": 3600.0}
    return settings


def done(job_id):
    return scalar("SELECT state FROM dbqueue_job WHERE id = %s", [job_id]) == "done"


def test_one_job_sends_only_the_named_workers_into_a_claim(slow_poll_settings, start_worker):
    workers = [start_worker(queues=["default"], concurrency=1) for _ in range(4)]
    wait_until(
        lambda: len(wakeup_slots()) == 4 and all(w.waiting.settled for w in workers),
        message="four idle workers waiting, each with a slot",
    )
    before = wait_until(lambda: _quiet(workers), message="the start-up claims done")
    jobs = 20
    for _ in range(jobs):
        job = enqueue("noop")
        wait_until(lambda job=job: done(job.id), timeout=5, message="the job, woken")
        wait_until(lambda: len(wakeup_slots()) == 4, message="all four waiting again")
    for worker in workers:
        worker.stop()
    for worker in workers:
        worker.thread.join(15)
    claims = sum(w.claims for w in workers) - before
    # Each job names two of the four (its count plus one): about 2 claims per job, where every
    # waiting worker claimed on every wake-up before (4 per job). The slack covers a start-up
    # claim counted late and a worker claiming once more as it started waiting again.
    assert claims <= 2 * jobs + 8, (claims, [w.claims for w in workers])


def _quiet(workers):
    """The workers' claim count, once every one is settled waiting and none is due to claim."""
    if all(w.waiting.settled and not w._claim_next for w in workers):
        return sum(w.claims for w in workers)
    return None


def test_a_worker_holding_no_slot_acts_on_every_wake_up(slow_poll_settings, start_worker):
    hog = direct()  # every slot held by one connection that never claims
    conns = [hog]
    try:
        hog.execute(
            "SELECT count(pg_advisory_lock(%s + s, hashtext('dbqueue:default'))::text) "
            "FROM generate_series(0, %s - 1) AS s",
            [sql.SLOT_LOCK, sql.WAKEUP_SLOTS],
        )
        assert len(wakeup_slots()) == sql.WAKEUP_SLOTS
        worker = start_worker(queues=["default"], concurrency=1)
        wait_until(lambda: worker.waiting.settled, message="the worker waiting")
        assert worker.waiting.slots == {"default": None}
        job = enqueue("noop")  # names slots 0 and 1, neither of them the worker's
        wait_until(lambda: done(job.id), timeout=5, message="the job, woken all the same")
    finally:
        for conn in conns:
            conn.close()


def test_a_worker_acts_on_a_wake_up_naming_it_or_nobody(slow_poll_settings, start_worker):
    worker = start_worker(queues=["default", "emails"], concurrency=1)
    wait_until(lambda: worker.waiting.settled, message="the worker waiting")
    slot = worker.waiting.slots["default"]
    assert slot is not None
    assert worker.waiting.acts_on("default", frozenset({slot}))
    assert worker.waiting.acts_on("default", frozenset({slot, slot + 1}))
    assert not worker.waiting.acts_on("default", frozenset({slot + 1}))
    assert worker.waiting.acts_on("default", None), "naming nobody"
