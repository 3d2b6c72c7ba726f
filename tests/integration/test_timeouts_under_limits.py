"""A run past its timeout whose job must not overlap a second run (a fleet-wide concurrency
limit counts it, or its handler runs in a child process) keeps its job `running`, its lease
renewed, until the run has ended; then its failure is written. Driven step by step on a worker
whose pool is not started, against the real database: the watchdog (check_timeouts), the
heartbeat (beat_once), the pool's end of the run (finished) and the acknowledgement flush,
in each order that matters. And HUNG_THREAD_LIMIT counting the threads stuck now."""

import time
import types

import pytest

from django_dbqueue import enqueue
from django_dbqueue.execution import ThreadPool
from django_dbqueue.processes import ProcessPool, _Child
from django_dbqueue.worker import Worker
from tests.integration.conftest import FAST
from tests.utils import job_row

pytestmark = pytest.mark.django_db(transaction=True)

LIMITED = {**FAST, "QUEUES": {**FAST["QUEUES"], "limited2": {"global_concurrency": 2}}}


@pytest.fixture
def idle_worker(settings):
    """A worker whose pool is not started: the test plays the handler threads."""
    settings.DBQUEUE = dict(LIMITED)
    workers = []

    def make(**kwargs):
        worker = Worker(**kwargs)
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.session.close()


def started_past_its_timeout(worker):
    """Claim, and start every claimed entry as a handler would, 10 s in the past."""
    worker.run_once()
    entries = {entry.ctx.id: entry for entry in worker.inflight.snapshot()}
    for entry in entries.values():
        assert worker.inflight.start(entry)
        entry.started -= 10
    return entries


def flush(worker):
    worker.acks.flush_once(worker.session)


def test_a_limited_job_past_its_timeout_stays_running_until_its_thread_returns(idle_worker):
    limited = enqueue("hang-recorded", queue="limited2")
    plain = enqueue("hang", queue="default")
    worker = idle_worker(queues=["limited2", "default"], concurrency=2)
    entries = started_past_its_timeout(worker)
    abandoned = []
    worker.pool.abandon = abandoned.append  # the replacement thread is not under test here

    assert worker.heartbeat.check_timeouts() == 2
    assert abandoned == [entries[limited.id], entries[plain.id]] or abandoned == [
        entries[plain.id],
        entries[limited.id],
    ]
    flush(worker)
    # The job without a limit: failed at once (the fast retry). The limited one: still running,
    # its slot of the limit still taken, while its thread runs.
    assert job_row(plain.id)["state"] == "pending"
    row = job_row(limited.id)
    assert (row["state"], row["errors"]) == ("running", [])
    # Its lease is renewed while the thread runs.
    before = row["leased_until"]
    kept, lost = worker.heartbeat.beat_once(worker.session)
    assert (kept, lost) == (1, 0)
    assert job_row(limited.id)["leased_until"] > before
    # Its thread returns: now the failure is written, the timeout's.
    worker.finished(entries[limited.id])
    flush(worker)
    row = job_row(limited.id)
    assert row["state"] == "pending"
    assert [e["class"] for e in row["errors"]] == ["TimeoutError"]
    assert worker.inflight.held() == []


def test_a_serially_keyed_job_past_its_timeout_keeps_its_key_until_its_thread_returns(
    idle_worker,
):
    first = enqueue("serial-hang", {"account": "a"})
    second = enqueue("serial-hang", {"account": "a"})
    worker = idle_worker(queues=["default"], concurrency=2)
    entries = started_past_its_timeout(worker)
    assert list(entries) == [first.id]  # the key's second job waits for the first
    worker.pool.abandon = lambda entry: None
    assert worker.heartbeat.check_timeouts() == 1
    flush(worker)
    assert job_row(first.id)["state"] == "running"
    assert worker.run_once()[0] == 0  # the key is still taken: its next job is not claimed
    worker.finished(entries[first.id])  # the thread returns
    flush(worker)
    assert job_row(first.id)["state"] == "pending"
    assert job_row(second.id)["state"] == "pending"


def test_a_limited_run_that_ends_right_after_its_timeout_is_seen_still_gets_its_failure(
    idle_worker,
):
    """The thread returns between the watchdog's mark and its holding of the failure: the
    watchdog writes the failure itself (once)."""
    limited = enqueue("hang-recorded", queue="limited2")
    worker = idle_worker(queues=["limited2"], concurrency=1)
    (entry,) = started_past_its_timeout(worker).values()
    worker.pool.abandon = lambda entry: None
    expire = worker.inflight.expire

    def expire_then_return(**kwargs):
        expired = expire(**kwargs)
        worker.finished(entry)  # the handler returns right now
        return expired

    worker.inflight.expire = expire_then_return
    assert worker.heartbeat.check_timeouts() == 1
    assert worker.acks.pending() == 1
    flush(worker)
    row = job_row(limited.id)
    assert row["state"] == "pending"
    assert [e["class"] for e in row["errors"]] == ["TimeoutError"]


class FakeProcess:
    pid = 4242

    def __init__(self):
        self.killed = 0

    def kill(self):
        self.killed += 1

    def join(self, timeout=None):
        pass


def test_in_process_mode_the_timeout_failure_waits_for_the_child_to_be_dead(idle_worker):
    """The watchdog only sends the kill; the slot's thread sees the child dead, reaps it and
    calls finished(): the failure is written then, not at the kill."""
    job = enqueue("hang", queue="default")
    worker = idle_worker(queues=["default"], concurrency=1, execution="process")
    assert isinstance(worker.pool, ProcessPool)
    (entry,) = started_past_its_timeout(worker).values()
    child = _Child.__new__(_Child)  # no real process: the kill is what matters here
    child.process = FakeProcess()
    worker.pool._children[id(entry)] = child

    assert worker.heartbeat.check_timeouts() == 1
    assert child.process.killed == 1  # the kill is sent...
    assert worker.acks.pending() == 0
    flush(worker)
    assert job_row(job.id)["state"] == "running"  # ...but the child may still run
    worker.pool._children.pop(id(entry))
    worker.finished(entry)  # the slot's thread: the child is dead and reaped
    flush(worker)
    row = job_row(job.id)
    assert row["state"] == "pending"
    assert [e["class"] for e in row["errors"]] == ["TimeoutError"]


class FakeWorker:
    def __init__(self):
        self.reasons = []

    def fatal(self, reason):
        self.reasons.append(reason)


def test_hung_thread_limit_counts_the_threads_stuck_now_in_either_order():
    worker = FakeWorker()
    pool = ThreadPool(worker, 1, hung_limit=1)
    spawned = []
    pool._spawn = lambda: spawned.append(1)

    class Run:  # hashable, like an inflight Entry
        def __init__(self, job_id):
            self.ctx = types.SimpleNamespace(id=job_id, type="hang", name="hang")
            self.started = time.monotonic()

    entry = Run

    for job_id in range(10):  # stuck, then returns: never more than 1 stuck at once
        stuck = entry(job_id)
        pool.abandon(stuck)
        assert pool.hung == 1
        pool._returned_late(stuck)
        assert pool.hung == 0
    late = entry(10)  # returns before the watchdog's abandon() sees it
    pool._returned_late(late)
    pool.abandon(late)
    assert pool.hung == 0
    assert len(spawned) == 11  # a replacement for each thread that left
    assert worker.reasons == []
    pool.abandon(entry(11))
    pool.abandon(entry(12))  # two stuck at once, past the limit of 1
    assert pool.hung == 2 and len(worker.reasons) == 1
