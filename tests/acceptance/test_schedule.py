"""Periodic jobs with no leader: three worker processes share one schedule."""

import datetime
import itertools
import os
import time

import pytest
from django.db import connection

from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

SETTINGS = "tests.acceptance.settings_schedule"
RUN_FOR = float(os.environ.get("DBQUEUE_SCHEDULE_TEST_SECONDS", "60"))


def ticks(name):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT idempotency_key FROM dbqueue_job WHERE idempotency_key LIKE %s",
            [f"dbqueue-schedule:{name}:%"],
        )
        keys = [row[0] for row in cursor.fetchall()]
    return [datetime.datetime.fromisoformat(key.split(":", 2)[2]) for key in keys]


def test_three_workers_one_second_schedule_exactly_one_job_per_tick(start_worker):
    workers = [start_worker(settings=SETTINGS, name=f"W{i}") for i in range(3)]
    wait_until(lambda: len(ticks("every-second")) >= 2, timeout=30, message="the first ticks")
    started = time.monotonic()
    # Let the three schedulers race for the full period, checking the workers stay up.
    wait_until(
        lambda: time.monotonic() - started >= RUN_FOR and all(w.alive for w in workers),
        timeout=RUN_FOR + 30,
        interval=0.5,
        message=f"{RUN_FOR:g}s of ticks",
    )
    seen = sorted(ticks("every-second"))
    assert len(seen) == len(set(seen)), "a tick was enqueued twice"
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(seen)]
    assert gaps and all(gap == 1.0 for gap in gaps), (
        f"missed ticks: {[g for g in gaps if g != 1.0]}"
    )
    assert len(seen) >= RUN_FOR
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM dbqueue_job WHERE idempotency_key LIKE 'dbqueue-schedule:every-second:%%' "
            "AND state = 'done'"
        )
        done = cursor.fetchone()[0]
    assert done >= len(seen) - 3  # the newest ticks may still be in flight
    assert sum("dbqueue schedule" in w.stderr() and "skipped" in w.stderr() for w in workers) == 0


def test_catch_up_after_a_stopped_fleet_follows_the_policy(start_worker):
    # The fleet was down for ten hours: the hourly entry's last tick is that old.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO dbqueue_schedule (name, last_tick, updated_at) "
            "VALUES ('hourly', now() - interval '10 hours 5 minutes', now())"
        )
    worker = start_worker(settings=SETTINGS)
    wait_until(lambda: len(ticks("hourly")) >= 2, timeout=30, message="the catch-up")
    worker.wait_for_output("dbqueue schedule 'hourly': skipped", timeout=10)
    # catch_up=2: the two most recent missed ticks run; an hour boundary in the last 30 s
    # (misfire_grace) would be on time and run too.
    assert len(ticks("hourly")) in (2, 3)
    for tick in ticks("hourly"):
        assert tick.minute == 0 and tick.second == 0
