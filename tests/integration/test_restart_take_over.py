"""The first pass of an image that restarted in place (django_dbqueue/restart.py), against the
database: the runs the old image handed over end first, counted, and only the jobs the worker id
holds that never started are handed back with their attempts given back. (The exec itself is in
tests/acceptance/test_restart_attempts.py.)"""

import pytest

from django_dbqueue import enqueue, restart, store
from django_dbqueue.worker import Worker
from tests.utils import job_row

pytestmark = pytest.mark.django_db(transaction=True)

WORKER = "host:9:restarted"


def claimed(**options):
    """A job claimed by WORKER under a token of its own; returns ``(id, token)``."""
    job_id = enqueue("record", {}, **options).id
    token = store.new_token()
    rows = store.claim(
        "default", worker_id=WORKER, queues=["default"], limits=[1], limit=1, token=token
    )
    assert [row.id for row in rows] == [job_id]
    return job_id, token


def handed_over(job_id, token, outcome):
    return {
        "id": job_id,
        "token": token,
        "type": "record",
        "name": "record",
        "queue": "default",
        "attempt": 1,
        "max_attempts": job_row(job_id)["max_attempts"],
        "outcome": outcome,
    }


def test_the_new_image_writes_the_runs_it_was_handed_and_gives_back_only_the_unstarted(
    fast_settings,
):
    timed_out, timed_out_token = claimed(max_attempts=1)
    cut_short, cut_short_token = claimed(max_attempts=3)
    finished, finished_token = claimed()
    lost_claim, _ = claimed()  # a claim whose reply the old image never read: never started
    timeout_error = {
        "attempt": 1,
        "class": "TimeoutError",
        "message": "job ran longer than its timeout of 1s; given up",
        "traceback": "",
        "worker": WORKER,
    }
    worker = Worker(queues=["default"], worker_id=WORKER)
    try:
        taken = restart.take_over(
            worker,
            [
                handed_over(timed_out, timed_out_token, ["failed", timeout_error, 0.0, False]),
                handed_over(cut_short, cut_short_token, ["spent"]),
                handed_over(finished, finished_token, ["done", '{"ok": 1}']),
            ],
        )
        assert taken == 3
        worker._reconnected = True  # what restart.resume sets
        # While it cannot tell yet what it holds, its own sweeps take nothing of its own.
        assert worker.sweeper.owner() is None

        assert worker._recover() == {lost_claim}
        lost = job_row(lost_claim)
        assert (lost["state"], lost["attempts"]) == ("pending", 0)  # never started: given back
        assert {job_row(i)["state"] for i in (timed_out, cut_short, finished)} == {"running"}

        assert worker.acks.flush_once(worker.session) == 3
    finally:
        worker.session.close()
    dead = job_row(timed_out)
    assert (dead["state"], dead["attempts"]) == ("dead", 1)
    assert [e["class"] for e in dead["errors"]] == ["TimeoutError"]
    retried = job_row(cut_short)
    assert (retried["state"], retried["attempts"]) == ("pending", 1)
    assert [e["class"] for e in retried["errors"]] == ["WorkerRestarted"]
    assert "restarted in place" in retried["errors"][0]["message"]
    done = job_row(finished)
    assert (done["state"], done["attempts"], done["result"]) == ("done", 1, {"ok": 1})
