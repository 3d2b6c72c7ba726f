"""Serial keys while an operator moves older jobs back to pending, and a worker is killed.

Three real ``run_jobqueue`` processes run the jobs of a few keys; meanwhile an operator keeps
cancelling the oldest pending job of a key (which lets the key's newer jobs be claimed) and
requeueing it at once (it is the oldest again, and pending while a newer one may be being
claimed): the interleaving of issue 25's race 3, at random points, across processes. One worker
is killed with SIGKILL in the middle of a job. Each run records its start and end with
clock_timestamp(); the runs of one key must never overlap (a run cut short by the kill ends at
the kill at the latest).
"""

import itertools
import os
import random
import signal
import threading
from collections import defaultdict

import pytest
from django.db import connections

from django_dbqueue import enqueue_many, store
from tests.acceptance.helpers import rows
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"
KEYS = 12
PER_KEY = 30


def _operator(stop, seed, actions):
    """Cancel the oldest pending job of a random key and requeue it at once, until ``stop``."""
    rng = random.Random(seed)
    try:
        while not stop.is_set():
            key = f"acct-{rng.randrange(KEYS)}"
            oldest = rows(
                "SELECT min(id) FROM dbqueue_job WHERE serial_key = %s AND state = 'pending'",
                [key],
            )[0][0]
            if oldest is None:
                continue
            if store.cancel("default", [oldest]):
                store.requeue("default", [oldest])
                actions.append(oldest)
    finally:
        connections.close_all()


def test_a_keys_runs_never_overlap_while_older_jobs_are_requeued_and_a_worker_is_killed(
    start_worker, settings
):
    settings.DBQUEUE = FAST_DBQUEUE  # the short lease is fixed at enqueue time
    jobs = [
        # Mostly short runs (many claims, many chances for the race), some long enough for the
        # kill to find worker A in the middle of one.
        ("serial-record", {"account": f"acct-{i % KEYS}", "sleep": 0.3 if i % 7 == 0 else 0.005})
        for i in range(KEYS * PER_KEY)
    ]
    ids = [j.id for j in enqueue_many(jobs)]
    workers = [
        start_worker("--concurrency", "4", settings=FAST, name=name) for name in ("A", "B", "C")
    ]
    seed = random.randrange(2**32)
    print(f"operator seed: {seed}")
    stop, actions = threading.Event(), []
    operator = threading.Thread(target=_operator, args=(stop, seed, actions))
    operator.start()
    try:
        victim = workers[0]
        wait_until(
            lambda: rows(
                "SELECT count(*) FROM testapp_serial_run WHERE pid = %s AND finished IS NULL",
                [victim.pid],
            )[0][0],
            timeout=30,
            message="worker A to be in the middle of a job",
        )
        os.kill(victim.pid, signal.SIGKILL)
        assert victim.wait_exit(10) == -signal.SIGKILL
        killed_at = rows("SELECT clock_timestamp()")[0][0]
        wait_until(
            lambda: (
                rows(
                    "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'done'", [ids]
                )[0][0]
                >= len(ids) // 2
            ),
            timeout=60,
            message="half of the jobs done, with the operator at work",
        )
    finally:
        stop.set()
        operator.join(30)
    wait_until(
        lambda: (
            rows("SELECT count(*) FROM dbqueue_job WHERE state IN ('pending', 'running')")[0][0]
            == 0
        ),
        timeout=90,
        message="every job finished",
    )
    for worker in workers[1:]:
        worker.assert_alive()
    assert actions, "the operator never moved an older job back to pending"

    runs = rows("SELECT key, job_id, started, finished, pid FROM testapp_serial_run")
    by_key = defaultdict(list)
    for key, job_id, started, finished, pid in runs:
        by_key[key].append((started, finished, job_id, pid))
    assert len(by_key) == KEYS
    overlaps = []
    for key, key_runs in by_key.items():
        key_runs.sort()
        for (_, finished, job_id, pid), (next_start, _, next_id, _) in itertools.pairwise(key_runs):
            end = finished if finished is not None else killed_at
            if finished is None:
                assert pid == victim.pid, (key, job_id)  # only the kill cuts a run short
            if end > next_start:
                overlaps.append((key, job_id, next_id))
    assert overlaps == [], f"seed {seed}: {len(overlaps)} overlapping runs, {overlaps[:5]}"
    # Every job ended: done, or cancelled (a cancel that met the job already claimed marks it,
    # and it ends cancelled after its run).
    ended = rows(
        "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state IN ('done', 'cancelled')",
        [ids],
    )
    assert ended[0][0] == len(ids)
