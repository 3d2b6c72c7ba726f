"""Wake-ups only for a worker that waits (waiters.py), against the real server: the locks that
say so, what an enqueue finds, and the race of a worker starting to wait while an enqueue that
found nobody has not committed yet."""

import threading
import time

import psycopg
import pytest
from django.db import connection, connections, transaction

from django_dbqueue import chain, enqueue, enqueue_many, waiters
from django_dbqueue.connections import connection_params
from django_dbqueue.notifications import Listener as ListenerThread
from django_dbqueue.notifications import parse_wakeup
from tests.utils import Listener, scalar, wait_until, wakeup_waiters

pytestmark = pytest.mark.django_db(transaction=True)

holders = wakeup_waiters


def lock_waiting(pid):
    """Whether backend ``pid`` waits for an advisory lock right now."""
    return scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s "
        "AND wait_event_type = 'Lock' AND wait_event = 'advisory'",
        [pid],
    )


def direct():
    return psycopg.connect(**connection_params("default"), autocommit=True)


@pytest.fixture
def plain():
    """A connection that LISTENs but does not say that it waits: it sees every wake-up sent."""
    listen = Listener(waits=False)
    yield listen
    listen.close()


@pytest.fixture
def waiting():
    """A connection that LISTENs and says that it waits on every queue, as an idle worker."""
    listen = Listener()
    yield listen
    listen.close()


class OpenEnqueue(threading.Thread):
    """Enqueues in a transaction of its own (its own connection), then keeps it open until
    ``commit()``: an enqueue that looked for waiters and has not ended yet."""

    def __init__(self, job_type="noop", queue=None):
        super().__init__(daemon=True)
        self.job_type, self.queue = job_type, queue
        self.looked, self.proceed = threading.Event(), threading.Event()
        self.job = self.committing_at = None
        self.committed = False

    def run(self):
        try:
            with transaction.atomic():
                self.job = enqueue(self.job_type, queue=self.queue)
                self.pid = connection.connection.info.backend_pid
                self.looked.set()
                self.proceed.wait(30)
                self.committing_at = time.monotonic()  # the COMMIT goes out after this
            self.committed = True
        finally:
            connections.close_all()

    def commit(self):
        self.proceed.set()
        self.join(10)
        assert self.committed


def test_an_enqueue_sends_no_wake_up_when_no_worker_waits(plain):
    with transaction.atomic():
        enqueue("noop")
    enqueue("noop")  # autocommit
    enqueue_many([("noop", {}), ("email", {})])
    chain(("noop", {}), ("noop", {}))
    assert plain.collect(0.3) == []
    assert scalar("SELECT count(*) FROM dbqueue_job") == 6
    assert holders() == set()


def test_a_waiting_worker_is_woken_for_its_own_queues_only(plain):
    emails = Listener(["emails"])
    try:
        assert holders("emails") == {emails.conn.info.backend_pid}
        enqueue("noop")  # default: nobody waits there
        enqueue("noop", delay=60)  # not due: no wake-up, as ever
        assert plain.collect(0.2) == []
        enqueue("email")
        enqueue_many([("noop", {}), ("email", {}), ("email", {})])
        chain(("noop", {}), {"type": "noop", "payload": {}, "queue": "emails"})
        # The first job of the chain is pending, on default; its second waits: neither wakes.
        assert sum(int(p.split(":")[0]) for p in plain.until_jobs(3)) == 3
        assert all(p.endswith(":emails") for p in plain.collect(0.2))
        assert all(p.endswith(":emails") for p in emails.collect(0.1))
    finally:
        emails.close()


def test_a_due_scheduled_job_and_a_workflow_wake_a_waiter(waiting):
    import datetime

    from django.utils import timezone

    enqueue("noop", run_after=timezone.now() - datetime.timedelta(seconds=5))  # already due
    chain(("noop", {}), ("noop", {}))  # its first job is pending, the second waits for it
    assert all(payload.endswith(":default") for payload in waiting.until_jobs(2))
    assert sum(parse_wakeup(payload)[1] for payload in waiting.collect(0.2)) == 2


def test_wakeup_if_waiting_false_wakes_for_every_due_job(plain, settings):
    settings.DBQUEUE = {**settings.DBQUEUE, "WAKEUP_IF_WAITING": False}
    enqueue("noop")
    enqueue("noop", delay=60)  # still not due: nothing
    assert plain.until_jobs(1) == ["1:default"]
    assert plain.collect(0.2) == ["1:default"]


def test_a_worker_starting_to_wait_waits_for_an_enqueue_that_found_nobody(plain):
    """The race the second lock closes: an enqueue that looked before the worker waited and
    commits after the worker's claim would be missed (no wake-up, and the claim ran before its
    commit). Starting to wait waits for that commit instead; enqueues that look meanwhile find
    the worker's queued request and wake it."""
    open_enqueue = OpenEnqueue()
    open_enqueue.start()
    assert open_enqueue.looked.wait(10)
    worker = direct()
    worker.execute("LISTEN dbqueue")
    result = {}

    def start_waiting():
        result["settled"] = waiters.hold(worker, ["default"])
        result["at"] = time.monotonic()

    # Its lock timeout is the statement's: 50 ms. Keep trying, as a worker does, until the
    # enqueue commits.
    def keep_trying():
        while not result.get("settled"):
            start_waiting()

    waiter = threading.Thread(target=keep_trying, daemon=True)
    waiter.start()
    try:
        pid = worker.info.backend_pid
        wait_until(lambda: lock_waiting(pid), message="the worker's request to queue up")
        assert pid in holders(), "it says it waits from its first statement on"
        enqueue("noop")  # looks while the worker's request waits, or after: either way, wakes
        assert plain.until_jobs(1) == ["1:default"]
        assert not result.get("settled"), "it got through while the open enqueue held it back"
        open_enqueue.commit()
        waiter.join(10)
        assert result["settled"] and result["at"] >= open_enqueue.committing_at
        # So the worker's next statement, its claim, sees that job.
        (count,) = worker.execute(
            "SELECT count(*) FROM dbqueue_job WHERE id = %s", [open_enqueue.job.id]
        ).fetchone()
        assert count == 1
        assert plain.collect(0.2) == ["1:default"], "the open enqueue found nobody: no wake-up"
    finally:
        open_enqueue.proceed.set()
        worker.close()


def test_an_enqueue_left_open_keeps_a_worker_trying_but_waiting(plain):
    open_enqueue = OpenEnqueue()
    open_enqueue.start()
    assert open_enqueue.looked.wait(10)
    worker = direct()
    try:
        started = time.monotonic()
        assert waiters.hold(worker, ["default"]) is False
        assert time.monotonic() - started < 2.0, "the lock timeout bounds the wait"
        assert worker.info.backend_pid in holders()
        enqueue("noop")  # it waits now, for new enqueues
        assert plain.until_jobs(1) == ["1:default"]
        open_enqueue.commit()
        assert waiters.hold(worker, ["default"]) is True
        waiters.wakeups.stop_waiting(worker)
        assert holders() == set(), "stopping drops every count, however often it was taken"
    finally:
        open_enqueue.proceed.set()
        worker.close()


def test_a_waiter_gone_with_its_connection_stops_the_wake_ups(plain):
    gone = Listener()
    enqueue("noop")
    assert plain.until_jobs(1) == ["1:default"]
    pid = gone.conn.info.backend_pid
    scalar("SELECT pg_terminate_backend(%s)", [pid])
    wait_until(lambda: holders() == set(), message="its lock gone with it")
    gone.conn.close()
    enqueue("noop")
    assert plain.collect(0.3) == ["1:default"]


def test_two_enqueues_at_once_find_nobody_and_neither_holds_the_other_up(plain):
    first, second = OpenEnqueue(), OpenEnqueue("email")
    first.start()
    second.start()
    assert first.looked.wait(10) and second.looked.wait(10)
    third = OpenEnqueue()  # the same queue as the first, while the first is open
    third.start()
    assert third.looked.wait(10), "an open enqueue held another one up"
    for open_enqueue in (first, second, third):
        open_enqueue.commit()
    assert plain.collect(0.3) == []


def test_a_listener_thread_says_that_its_workers_wait(plain):
    """Where the workers' own connections may be pooled (LISTEN_DATABASE), the listener thread
    says it on its direct connection, for as long as it is connected."""
    got, stop = [], threading.Event()
    listener = ListenerThread("default", "dbqueue", got.append, stop, wait_queues=["default"])
    listener.start()
    try:
        assert listener.connected.wait(10)
        pid = wait_until(
            lambda: scalar(
                "SELECT pid FROM pg_stat_activity WHERE application_name = "
                "'dbqueue listener (LISTEN dbqueue)' AND datname = current_database()"
            ),
            message="the listener's connection",
        )
        assert holders() == {pid}
        enqueue("noop")
        wait_until(lambda: "1:default" in got, message="the listener woken")
    finally:
        stop.set()
        listener.join(5)
    wait_until(lambda: holders() == set(), message="the lock gone with the listener")


# A worker's own side --------------------------------------------------------------------------


@pytest.fixture
def slow_poll(settings, fast_settings):
    """The poll an hour away: a job started within seconds was woken."""
    settings.DBQUEUE = {**settings.DBQUEUE, "POLL_INTERVAL": 3600.0}
    return settings


def session_pid(worker):
    return wait_until(
        lambda: worker.session.conn is not None and worker.session.conn.info.backend_pid,
        message="the worker's connection",
    )


def done(job_id):
    return scalar("SELECT state FROM dbqueue_job WHERE id = %s", [job_id]) == "done"


def full_worker(settings, start_worker, flag, jobs):
    """A worker of 2 threads and a prefetch of 2 (4 slots) with ``jobs`` waiting for ``flag``
    enqueued first: its slots full and ``running`` 4, it stops waiting. Returns the job ids and
    its session's backend pid."""
    settings.DBQUEUE = {**settings.DBQUEUE, "PREFETCH": 2}
    ids = [enqueue("slow-record", {"until_file": str(flag), "seconds": 30}).id for _ in range(jobs)]
    worker = start_worker(queues=["default"], concurrency=2)
    pid = session_pid(worker)
    wait_until(
        lambda: scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'running'") == 4,
        message="the slots full",
    )
    wait_until(lambda: holders() == set(), message="the full worker to stop waiting")
    return ids, pid


def test_an_idle_worker_waits_and_an_enqueue_wakes_it(slow_poll, start_worker, plain):
    worker = start_worker(queues=["default"], concurrency=2)
    pid = session_pid(worker)
    wait_until(lambda: holders() == {pid}, message="the idle worker to say it waits")
    assert holders("emails") == set(), "it waits for its own queues only"
    job = enqueue("noop")
    wait_until(lambda: done(job.id), timeout=5, message="the job, well before the poll")
    assert plain.until_jobs(1) == ["1:default"], "one slot held, two wanted: nobody named"


def test_a_worker_draining_a_backlog_does_not_wait_then_waits_again(
    slow_poll, start_worker, plain, tmp_path
):
    """With every slot full the worker claims again by itself: it stops waiting, so enqueues
    meanwhile send nothing, and none of their jobs is left behind: it claims them as its slots
    free up, then waits again."""
    flag = tmp_path / "go"
    backlog, pid = full_worker(slow_poll, start_worker, flag, 6)  # 4 run or wait, 2 queued
    late = enqueue("noop")
    assert plain.collect(0.3) == [], "nobody waits: no wake-up"
    flag.write_text("go")
    for job_id in [*backlog, late.id]:
        wait_until(lambda j=job_id: done(j), timeout=10, message=f"job {job_id}")
    wait_until(lambda: holders() == {pid}, message="the idle worker to wait again")
    again = enqueue("noop")
    wait_until(lambda: done(again.id), timeout=5, message="the next job, woken")
    assert plain.until_jobs(1) == ["1:default"]


def test_workers_that_are_never_woken_do_not_say_they_wait(slow_poll, start_worker):
    slow_poll.DBQUEUE = {**slow_poll.DBQUEUE, "LISTEN": False}
    start_worker(queues=["default"])
    start_worker(queues=["emails"], burst=True, listen=True)
    job = enqueue("email")
    wait_until(lambda: done(job.id), message="the burst worker's job")
    assert holders() == set() and holders("emails") == set()


def test_a_worker_with_a_small_prefetch_waits_even_when_full(slow_poll, start_worker, tmp_path):
    """PREFETCH below the threads: a full worker would not claim by itself as soon as a thread
    is free, so it keeps waiting for every wake-up."""
    flag = tmp_path / "go"
    slow_poll.DBQUEUE = {**slow_poll.DBQUEUE, "PREFETCH": 0}
    for _ in range(3):
        enqueue("slow-record", {"until_file": str(flag), "seconds": 30})
    worker = start_worker(queues=["default"], concurrency=2)
    pid = session_pid(worker)
    wait_until(
        lambda: scalar("SELECT count(*) FROM dbqueue_job WHERE state = 'running'") == 2,
        message="both threads busy",
    )
    wait_until(lambda: holders() == {pid}, message="the full worker still waiting")
    flag.write_text("go")


def test_a_worker_waits_again_after_its_connection_is_killed(slow_poll, start_worker):
    worker = start_worker(queues=["default"])
    first = session_pid(worker)
    wait_until(lambda: holders() == {first}, message="the worker to wait")
    scalar("SELECT pg_terminate_backend(%s)", [first])
    wait_until(
        lambda: (pids := holders()) and first not in pids and pids,
        timeout=15,
        message="the reconnected worker to wait again",
    )
    job = enqueue("noop")
    wait_until(lambda: done(job.id), timeout=5, message="the job, woken")


def test_an_enqueue_that_found_a_full_worker_is_claimed_when_it_starts_waiting(
    slow_poll, start_worker, plain, tmp_path
):
    """The race at a worker's own pace: an enqueue looks while the worker is full (nobody
    waits), and commits only after the worker's claim found the queue empty. The worker, starting
    to wait, waits for that commit, then claims again: the job runs at once, not at the poll."""
    flag = tmp_path / "go"
    _, pid = full_worker(slow_poll, start_worker, flag, 4)  # exactly its 4 slots
    open_enqueue = OpenEnqueue()
    open_enqueue.start()
    try:
        assert open_enqueue.looked.wait(10)
        flag.write_text("go")  # the slots free up; its claim finds nothing committed
        wait_until(
            lambda: pid in holders() and lock_waiting(pid),
            message="the worker waiting for the open enqueue",
        )
        open_enqueue.commit()
        wait_until(lambda: done(open_enqueue.job.id), timeout=5, message="the job, at once")
    finally:
        open_enqueue.proceed.set()
    assert plain.collect(0.1) == [], "its enqueue found nobody waiting: no wake-up was sent"


class SteadyEnqueues:
    """``threads`` enqueuers, each committing one job after another in transactions that stay
    open ``hold`` seconds after the enqueue (a request that enqueues, then does its other work):
    at every instant some enqueue has looked and not ended."""

    def __init__(self, threads=4, hold=0.2):
        self.stopped, self.hold, self.count = threading.Event(), hold, 0
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(threads)]
        for thread in self.threads:
            thread.start()

    def run(self):
        try:
            while not self.stopped.is_set():
                with transaction.atomic():
                    enqueue("noop")
                    self.stopped.wait(self.hold)  # the rest of the request's work
                self.count += 1
        finally:
            connections.close_all()

    def stop(self):
        self.stopped.set()
        for thread in self.threads:
            thread.join(10)


def test_an_enqueue_that_found_a_worker_waiting_holds_no_other_worker_up():
    """An open enqueue that found a waiter holds nothing a second worker, starting to wait,
    must wait for: only enqueues that found nobody do."""
    first = direct()
    assert waiters.hold(first, ["default"])
    open_enqueue = OpenEnqueue()
    open_enqueue.start()
    second = direct()
    try:
        assert open_enqueue.looked.wait(10)
        waiters.start(second, ["default"])
        assert waiters.await_enqueuers(second, ["default"]), "held up by an enqueue that woke"
        open_enqueue.commit()
    finally:
        open_enqueue.proceed.set()
        first.close()
        second.close()


def test_a_worker_starting_to_wait_gets_through_a_steady_stream_of_enqueues():
    """Enqueues that find a worker waiting take no lock it must wait for, so a worker starting
    to wait waits only for those that looked before it did: it gets through however busy the
    queue's producers are (an enqueue taking that lock before looking kept one out for good)."""
    load = SteadyEnqueues()
    worker = direct()
    try:
        wait_until(lambda: load.count >= 8, message="the enqueues under way")
        waiters.start(worker, ["default"])
        wait_until(
            lambda: waiters.await_enqueuers(worker, ["default"]),
            timeout=5,
            interval=0.05,
            message="the worker to get through",
        )
    finally:
        load.stop()
        worker.close()


def test_a_listener_delivers_wake_ups_before_it_got_through(plain):
    """A listener behind a pooler says it waits, then listens at once: the wake-ups of the
    enqueues that found it reach its workers while it still waits for older ones."""
    got, stop = [], threading.Event()
    open_enqueue = OpenEnqueue()  # looked before the listener: it must wait for this one
    open_enqueue.start()
    assert open_enqueue.looked.wait(10)
    listener = ListenerThread("default", "dbqueue", got.append, stop, wait_queues=["default"])
    listener.start()
    try:
        assert listener.connected.wait(10), "it listens before it got through"
        assert got == [None], "and tells its workers to claim"
        enqueue("noop")
        wait_until(lambda: "1:default" in got, message="the new enqueue's wake-up")
        open_enqueue.commit()
        wait_until(
            lambda: got.count(None) == 2, message="a second claim once the open enqueue ended"
        )
    finally:
        open_enqueue.proceed.set()
        stop.set()
        listener.join(5)


def test_a_worker_whose_connection_was_reset_after_a_refused_claim_waits_on_the_new_one(
    slow_poll, start_worker, monkeypatch
):
    """A database error that is not a lost connection, in the claim that carries completions,
    resets the Session (the locks go with its connection): the worker says it waits again on
    the new one, and the next enqueue wakes it."""
    from django_dbqueue.connections import Session

    slow_poll.DBQUEUE = {**slow_poll.DBQUEUE, "PREFETCH": 2}
    real, refused = Session.execute_pipelined, []

    def refuse_once(self, statements):
        if not refused:
            refused.append(self.conn.info.backend_pid)
            raise psycopg.errors.FeatureNotSupported("cached plan must not change result type")
        return real(self, statements)

    monkeypatch.setattr(Session, "execute_pipelined", refuse_once)
    backlog = [job.id for job in enqueue_many([("noop", {})] * 12)]
    start_worker(queues=["default"], concurrency=2)
    for job_id in backlog:
        wait_until(lambda j=job_id: done(j), timeout=10, message=f"job {job_id}")
    assert refused, "no claim carried completions: the test did not reach its path"
    wait_until(
        lambda: (pids := holders()) and refused[0] not in pids,
        message="the worker waiting on its new connection",
    )
    job = enqueue("noop")
    wait_until(lambda: done(job.id), timeout=5, message="the next job, woken")
