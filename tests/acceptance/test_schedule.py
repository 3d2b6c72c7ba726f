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


def test_a_settings_entry_catches_up_all_missed_ticks_within_its_window(start_worker):
    with connection.cursor() as cursor:  # ten hours down; the window is five hours
        cursor.execute(
            "INSERT INTO dbqueue_schedule (name, last_tick, updated_at) "
            "VALUES ('hourly-all', now() - interval '10 hours 5 minutes', now())"
        )
    start_worker(settings=SETTINGS)
    wait_until(lambda: len(ticks("hourly-all")) >= 5, timeout=30, message="the catch-up")
    now = datetime.datetime.now(datetime.UTC)
    seen = sorted(ticks("hourly-all"))
    # The five hour boundaries of the last five hours, and none older.
    assert len(seen) == 5, seen
    assert all(now - tick < datetime.timedelta(hours=5, minutes=1) for tick in seen)
    assert all(tick.minute == 0 and tick.second == 0 for tick in seen)


# -- stored entries: edited while three workers tick them, one killed with kill -9 -------------


def stored_jobs(name):
    """``{tick: payload}`` of a stored entry's jobs, and how many jobs there are."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT idempotency_key, payload::text FROM dbqueue_job WHERE idempotency_key LIKE %s",
            [f"dbqueue-schedule:{name}:%"],
        )
        rows = cursor.fetchall()
    import json

    jobs = {datetime.datetime.fromisoformat(key.split(":", 2)[2]): json.loads(p) for key, p in rows}
    assert len(jobs) == len(rows), "two jobs for one tick"
    return jobs


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def near(moment, instants, slack=datetime.timedelta(milliseconds=50)):
    return any(abs(moment - instant) <= slack for instant in instants)


EDIT_FOR = float(os.environ.get("DBQUEUE_SCHEDULE_EDIT_SECONDS", "24"))


def test_stored_entries_tick_once_with_no_gap_while_edited_and_a_worker_is_killed(
    start_worker, settings
):
    from django_dbqueue.schedule_entries import schedule_job, update_schedule

    second = schedule_job("db-second", "echo", every=1, payload={"v": 0})
    flip = schedule_job("db-flip", "noop", every=1)
    start = min(second.last_tick, flip.last_tick)
    workers = [start_worker(settings=SETTINGS, name=f"W{i}") for i in range(3)]
    wait_until(lambda: len(stored_jobs("db-second")) >= 2, timeout=30, message="the first ticks")

    # (edit instant, v) of db-second's payload edits; db-flip's phases as (instant, timing).
    versions = [(second.updated_at, 0)]
    phases = [(flip.last_tick, 1)]
    plan = {
        0.2: ("disable", None),
        0.35: ("enable", None),
        0.5: ("every", 2),
        0.7: ("every", 1),
    }
    killed = False
    began = time.monotonic()
    v = 0
    while (elapsed := (time.monotonic() - began) / EDIT_FOR) < 1:
        v += 1
        entry = update_schedule("db-second", payload={"v": v})
        versions.append((entry.updated_at, v))
        for at_fraction, (what, value) in list(plan.items()):
            if elapsed >= at_fraction:
                del plan[at_fraction]
                if what == "disable":
                    entry = update_schedule("db-flip", enabled=False)
                    phases.append((entry.updated_at, None))
                elif what == "enable":
                    entry = update_schedule("db-flip", enabled=True)
                    phases.append((entry.last_tick, 1))
                else:
                    entry = update_schedule("db-flip", every=value)
                    phases.append((entry.last_tick, value))
        if not killed and elapsed >= 0.45:
            workers[0].kill()  # kill -9, whatever it was doing (ticking, perhaps)
            workers.append(start_worker(settings=SETTINGS, name="W3"))
            killed = True
        time.sleep(0.3)  # the pace of the edits, not a wait for a condition
    end = db_now()
    # Every tick up to ``end`` is enqueued within a few passes (SCHEDULE_INTERVAL 0.25 s).
    wait_until(lambda: max(stored_jobs("db-second")) >= end, timeout=30, message="the last ticks")
    assert all(w.alive for w in workers[1:])

    # db-second: one job per second from the first tick to ``end``, none missing, and each
    # with the payload of the last edit before its tick ("takes effect from the next tick").
    jobs = {t: p for t, p in stored_jobs("db-second").items() if t <= end}
    first = min(jobs)
    expected = {
        first + datetime.timedelta(seconds=i) for i in range(int((end - first).total_seconds()) + 1)
    }
    assert set(jobs) == expected, f"missing {sorted(expected - set(jobs))[:5]}"
    edit_instants = [instant for instant, _ in versions]
    for tick, payload in jobs.items():
        if near(tick, edit_instants):
            continue  # a tick within 50 ms of an edit: either version is right
        in_force = max((i for i in versions if i[0] < tick), key=lambda i: i[0])[1]
        assert payload == {"v": in_force}, (tick, payload, in_force)

    # db-flip: the ticks of each phase's timing after the phase began, none while disabled.
    flips = {t for t in stored_jobs("db-flip") if t <= end}
    boundaries = [instant for instant, _ in phases]
    expected = set()
    for (begin, every), (finish, _) in itertools.pairwise([*phases, (end, None)]):
        if every is None:
            continue
        moment = (int(begin.timestamp() // every) + 1) * every
        while moment <= finish.timestamp():
            expected.add(datetime.datetime.fromtimestamp(moment, datetime.UTC))
            moment += every
    unsure = {t for t in expected | flips if near(t, boundaries)}
    assert flips - unsure == expected - unsure, (
        f"extra {sorted(flips - expected)[:5]}, missing {sorted(expected - flips)[:5]}"
    )
    assert start <= min(flips)


def test_stored_entries_catch_up_after_a_stopped_fleet_by_their_policy(start_worker):
    from django_dbqueue.schedule_entries import schedule_job

    grace = {"every": 3600, "misfire_grace": 30}
    schedule_job("db-none", "noop", catch_up="none", **grace)
    schedule_job("db-latest", "noop", catch_up="latest", **grace)
    schedule_job("db-all", "noop", catch_up="all", catch_up_window=3 * 3600, **grace)
    with connection.cursor() as cursor:  # the fleet was stopped for ten hours
        cursor.execute(
            "UPDATE dbqueue_schedule_entry SET last_tick = now() - interval '10 hours 5 minutes'"
        )
    worker = start_worker(settings=SETTINGS)
    wait_until(
        lambda: all(
            row[0] > datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
            for row in _last_ticks()
        ),
        timeout=30,
        message="every entry's pass",
    )
    worker.wait_for_output("dbqueue schedule 'db-none': skipped", timeout=10)
    # none: no missed tick runs. An hour boundary in the last 30 s (misfire_grace) is on time,
    # though, and runs for each entry.
    extra = len(ticks("db-none"))
    assert extra in (0, 1)
    assert len(ticks("db-latest")) == 1 + extra
    assert len(ticks("db-all")) == 3  # the hour boundaries of the last three hours
    for name in ("db-latest", "db-all"):
        assert all(t.minute == 0 and t.second == 0 for t in ticks(name))


def _last_ticks():
    with connection.cursor() as cursor:
        cursor.execute("SELECT last_tick FROM dbqueue_schedule_entry")
        return cursor.fetchall()
