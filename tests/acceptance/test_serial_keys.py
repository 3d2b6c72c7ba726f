"""Serial keys and unique keys across a fleet of real worker processes.

Jobs sharing a serial key never overlap and start in enqueue order; jobs of other keys run
alongside. The killed worker's job keeps its key until its lease expires and the sweeper takes
it back; it then runs again before any newer job of its key.
"""

import itertools
import os
import signal
import time
from collections import defaultdict

import pytest
from django.db import connection

from django_dbqueue import enqueue, enqueue_many
from tests.acceptance.helpers import rows, wait_all_in_state, wait_for_listeners
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import run_concurrently, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"
KEYS = 10
PER_KEY = 10


def test_serial_keys_never_overlap_and_keep_enqueue_order_through_a_sigkill(start_worker, settings):
    settings.DBQUEUE = FAST_DBQUEUE  # the short lease is fixed at enqueue time
    # Interleaved keys, one enqueue order: key k's jobs are every KEYS-th job.
    jobs = [
        ("serial-record", {"account": f"acct-{i % KEYS}", "sleep": 0.15})
        for i in range(KEYS * PER_KEY)
    ]
    ids = [j.id for j in enqueue_many(jobs)]
    workers = [
        start_worker("--concurrency", "4", settings=FAST, name=name) for name in ("A", "B", "C")
    ]
    victim = workers[0]
    wait_until(
        lambda: rows(
            "SELECT count(*) FROM testapp_serial_run WHERE pid = %s AND finished IS NULL",
            [victim.pid],
        )[0][0],
        timeout=20,
        message="worker A to be in the middle of a job",
    )
    os.kill(victim.pid, signal.SIGKILL)
    assert victim.wait_exit(10) == -signal.SIGKILL
    killed_at = rows("SELECT clock_timestamp()")[0][0]

    wait_all_in_state(ids, "done", timeout=45)
    for worker in workers[1:]:
        worker.assert_alive()

    runs = rows(
        "SELECT key, job_id, started, finished, pid FROM testapp_serial_run ORDER BY started"
    )
    by_key = defaultdict(list)
    for key, job_id, started, finished, pid in runs:
        by_key[key].append((job_id, started, finished, pid))
    assert len(by_key) == KEYS
    cut_short = [r for r in runs if r[3] is None]
    assert cut_short and all(pid == victim.pid for *_, pid in cut_short), cut_short
    assert len(runs) == len(ids) + len(cut_short)  # only the killed runs ran again
    for key, key_runs in by_key.items():
        # Enqueue order: by start time, the job ids never go back (a rerun of the killed job
        # comes right after its first run, before any newer job of its key).
        started_ids = [job_id for job_id, *_ in key_runs]
        assert started_ids == sorted(started_ids), (key, started_ids)
        completed = [job_id for job_id, _, finished, _ in key_runs if finished is not None]
        assert completed == sorted(set(completed)) and len(completed) == PER_KEY, (key, completed)
        # No overlap: each run ended before the next of its key started; a run cut short by the
        # kill ended at the kill at the latest, and its key stayed held until its lease expired.
        for (_, _, finished, _), (next_id, next_start, _, _) in itertools.pairwise(key_runs):
            end = finished if finished is not None else killed_at
            assert end <= next_start, (key, next_id)
    # Other keys ran alongside each other: the fleet was not serialised as a whole.
    assert _max_parallel(runs) > 1
    with connection.cursor() as cursor:  # nothing leaked: no job holds a key any more
        cursor.execute("SELECT count(*) FROM dbqueue_job WHERE state IN ('pending', 'running')")
        assert cursor.fetchone()[0] == 0


def _max_parallel(runs):
    events = []
    for _, _, started, finished, _ in runs:
        if finished is not None:
            events += [(started, 1), (finished, -1)]
    best = current = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        current += delta
        best = max(best, current)
    return best


def test_unique_while_active_never_runs_two_jobs_of_a_key_at_once(start_worker, settings):
    """Enqueuers on their own connections keep asking for the job of one key while two worker
    processes run it: every ask while a job is live returns it, so runs never overlap, and a
    new job follows as soon as the previous one finished."""
    settings.DBQUEUE = FAST_DBQUEUE
    workers = [start_worker("--concurrency", "4", settings=FAST, name=n) for n in ("A", "B")]
    wait_for_listeners(2)
    stop = time.monotonic() + 3.0

    def ask():
        got = []
        while time.monotonic() < stop:
            job = enqueue(
                "serial-record",
                {"label": "u", "sleep": 0.05},
                unique_key="u",
                unique_while="active",
            )
            got.append(job)
        return got

    asks = [job for batch in run_concurrently(4, ask) for job in batch]
    created = sorted({job.id for job in asks if job.created})
    assert len(created) > 3, "the workers should have finished several generations"
    assert len({job.id for job in asks}) == len(created)  # every other ask got a live job
    wait_all_in_state(created, "done", timeout=20)
    runs = rows("SELECT job_id, started, finished FROM testapp_serial_run ORDER BY started")
    assert sorted(job_id for job_id, _, _ in runs) == created  # each ran once
    for (_, _, finished), (job_id, started, _) in itertools.pairwise(runs):
        assert finished <= started, job_id
    for worker in workers:
        worker.assert_alive()
