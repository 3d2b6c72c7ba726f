import threading

import pytest

from django_dbqueue import wakeup
from django_dbqueue.worker import Worker
from tests.held import Caller

FAST = {
    "QUEUES": {"default": {}, "emails": {}},
    "POLL_INTERVAL": 0.05,
    "HEARTBEAT_INTERVAL": 0.1,
    "LEASE": 5.0,
    "SWEEP_INTERVAL": 0.1,
    "BACKOFF_BASE": 0.01,
    "BACKOFF_CAP": 0.05,
    "SHUTDOWN_GRACE": 2.0,
    "STATUS_INTERVAL": 0,
}


@pytest.fixture
def fast_settings(settings):
    """Short intervals so in-process workers react within milliseconds."""
    settings.DBQUEUE = dict(FAST)
    return settings


@pytest.fixture
def start_worker(fast_settings):
    """Start in-process workers on background threads; stops and joins them at teardown."""
    started = []

    def start(**kwargs):
        worker = Worker(**kwargs)
        result = {}
        thread = threading.Thread(
            target=lambda: result.setdefault("code", worker.run()), daemon=True
        )
        thread.start()
        worker.thread = thread
        worker.result = result
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
    for worker in started:
        worker.thread.join(15)
        assert not worker.thread.is_alive(), "worker did not stop"


@pytest.fixture(autouse=True)
def _wakeups_settled():
    """Each test starts with no queue notified "just now" by the previous one (so its first
    wake-up is sent at once), and leaves no wake-up sender connected to the test database."""
    wakeup._COALESCER._last.clear()
    yield
    assert wakeup.flush(5.0, close=True), "wake-up sender did not settle"


@pytest.fixture
def callers():
    """``callers(sql, params)``: a caller's transaction on a connection of its own, holding
    what ``sql`` selects until its ``commit()``; rolled back at teardown if still open."""
    holding = []

    def hold(sql, params):
        holding.append(Caller(sql, params))
        return holding[-1]

    yield hold
    for caller in holding:
        caller.rollback()


@pytest.fixture
def held(callers):
    """``held(job_id)``: a caller's transaction holding a job's row lock as a writer takes it
    (FOR NO KEY UPDATE, what an UPDATE of the row takes; ``strength="FOR UPDATE"`` is a
    ``select_for_update()``'s)."""

    def hold(job_id, strength="FOR NO KEY UPDATE"):
        return callers(f"SELECT 1 FROM dbqueue_job WHERE id = %s {strength}", [job_id])

    return hold
