"""Periodic jobs: tick arithmetic, exactly one job per tick with several schedulers at once,
the catch-up policy after downtime, checks and the status listing."""

import datetime
import threading

import pytest
from django.db import connection

from django_dbqueue.checks import check_settings
from django_dbqueue.conf import get_settings
from django_dbqueue.scheduler import Schedule, Scheduler
from tests.utils import scalar

UTC = datetime.UTC


def at(*args):
    return datetime.datetime(*args, tzinfo=UTC)


def test_interval_ticks_are_epoch_aligned_so_every_worker_agrees():
    s = Schedule(name="s", type="noop", every=15)
    ticks = s.ticks_between(at(2026, 1, 1, 0, 0, 7), at(2026, 1, 1, 0, 1, 0), 100)
    assert ticks == [
        at(2026, 1, 1, 0, 0, 15),
        at(2026, 1, 1, 0, 0, 30),
        at(2026, 1, 1, 0, 0, 45),
        at(2026, 1, 1, 0, 1, 0),
    ]
    assert s.ticks_before(at(2026, 1, 1, 0, 1, 5), 2, at(2020, 1, 1)) == [
        at(2026, 1, 1, 0, 0, 45),
        at(2026, 1, 1, 0, 1, 0),
    ]


def test_cron_ticks_in_the_schedule_timezone():
    s = Schedule(name="s", type="noop", cron="0 3 * * *", timezone="Europe/Amsterdam")
    ticks = s.ticks_between(at(2026, 7, 1), at(2026, 7, 3), 10)
    assert ticks == [at(2026, 7, 1, 1), at(2026, 7, 2, 1)]  # 03:00 CEST is 01:00 UTC
    assert s.ticks_before(at(2026, 7, 3), 1, at(2026, 1, 1)) == [at(2026, 7, 2, 1)]
    assert s.next_tick(at(2026, 7, 2, 1)) == at(2026, 7, 3, 1)


def set_last_tick(name, seconds_ago):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO dbqueue_schedule (name, last_tick, updated_at) VALUES (%s, now() - %s * interval '1 second', now()) "
            "ON CONFLICT (name) DO UPDATE SET last_tick = EXCLUDED.last_tick",
            [name, seconds_ago],
        )


@pytest.mark.django_db(transaction=True)
def test_first_pass_starts_from_now_then_enqueues_each_tick_once(settings):
    settings.DBQUEUE = {
        "QUEUES": {"default": {}, "emails": {}},
        "SCHEDULE": {"beat": {"every": 60, "type": "noop"}},
    }
    scheduler = Scheduler()
    assert scheduler.run_once() == {"enqueued": 0, "skipped": 0}
    set_last_tick("beat", 150)  # two ticks and a bit ago
    assert scheduler.run_once()["enqueued"] in (2, 3)
    assert scheduler.run_once() == {"enqueued": 0, "skipped": 0}
    keys = scalar("SELECT array_agg(idempotency_key) FROM dbqueue_job")
    assert all(k.startswith("dbqueue-schedule:beat:") for k in keys)


@pytest.mark.django_db(transaction=True)
def test_catch_up_after_downtime_follows_the_policy(settings):
    settings.DBQUEUE = {
        "QUEUES": {"default": {}, "emails": {}},
        "SCHEDULE": {
            "hourly-report": {"every": 3600, "type": "noop", "catch_up": 2, "misfire_grace": 60},
            "none-missed": {"every": 3600, "type": "noop", "catch_up": 0, "misfire_grace": 60},
        },
    }
    set_last_tick("hourly-report", 10 * 3600 + 120)  # ten hours down
    set_last_tick("none-missed", 10 * 3600 + 120)
    counts = Scheduler().run_once()
    hourly = scalar(
        "SELECT count(*) FROM dbqueue_job WHERE idempotency_key LIKE 'dbqueue-schedule:hourly-report:%%'"
    )
    none = scalar(
        "SELECT count(*) FROM dbqueue_job WHERE idempotency_key LIKE 'dbqueue-schedule:none-missed:%%'"
    )
    # Unless an hour boundary fell in the last 60 s (then it is on time and runs too):
    assert hourly in (2, 3) and none in (0, 1)
    # Ten (or eleven) hourly ticks were missed by each: 2 caught up by one, none by the other.
    assert 16 <= counts["skipped"] <= 20


@pytest.mark.django_db(transaction=True)
def test_three_schedulers_racing_make_exactly_one_job_per_tick(settings):
    settings.DBQUEUE = {
        "QUEUES": {"default": {}, "emails": {}},
        "SCHEDULE": {"fast": {"every": 1, "type": "noop", "misfire_grace": 600}},
    }
    set_last_tick("fast", 300)  # 300 one-second ticks are due, all on time
    barrier = threading.Barrier(3)

    def run():
        barrier.wait(10)
        for _ in range(5):
            Scheduler().run_once()
        connection.close()

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    count, distinct = scalar(
        "SELECT ARRAY[count(*), count(DISTINCT idempotency_key)] FROM dbqueue_job"
    )
    assert count == distinct and 300 <= count <= 306


@pytest.mark.parametrize(
    ("entry", "check_id", "fragment"),
    [
        ({"every": 60, "type": "nope"}, "dbqueue.E007", "names job type 'nope'"),
        ({"cron": "61 * * * *", "type": "noop"}, "dbqueue.E008", "not a valid cron expression"),
        ({"type": "noop"}, "dbqueue.E008", "exactly one of 'cron'"),
        ({"every": 0.5, "type": "noop"}, "dbqueue.E008", "must be at least 1 second, got 0.5"),
        (
            {"every": 60, "type": "noop", "queue": "nope"},
            "dbqueue.E010",
            "not in DBQUEUE['QUEUES']",
        ),
        (
            {"every": 60, "type": "noop", "payload": {"d": datetime.date.today()}},
            "dbqueue.E010",
            'payload\']["d"]',
        ),
        ({"every": 60, "type": "noop", "colour": 1}, "dbqueue.E010", "unknown keys ['colour']"),
        (
            {"every": 60, "type": "noop", "timezone": "Mars/Olympus"},
            "dbqueue.E010",
            "not a known time zone",
        ),
        # Six or seven fields: croniter reads the sixth as seconds (issue 35, part 7).
        (
            {"cron": "0 0 3 * * *", "type": "noop"},
            "dbqueue.E008",
            "'0 0 3 * * *' has 6 fields; a cron expression here has exactly five",
        ),
        ({"cron": "* * * * * * *", "type": "noop"}, "dbqueue.E008", "has 7 fields"),
        ({"cron": "0 3 * *", "type": "noop"}, "dbqueue.E008", "not a valid cron expression"),
        ({"cron": 5, "type": "noop"}, "dbqueue.E008", "5 is not a valid cron expression"),
        ({"cron": ["0 3 * * *"], "type": "noop"}, "dbqueue.E008", "not a valid cron expression"),
        # Names of files in the zone directory that are no IANA zone.
        (
            {"cron": "0 3 * * *", "type": "noop", "timezone": "localtime"},
            "dbqueue.E010",
            "'localtime' is not an IANA time zone name",
        ),
        (
            {"cron": "0 3 * * *", "type": "noop", "timezone": "Factory"},
            "dbqueue.E010",
            "'Factory' is not an IANA time zone name",
        ),
    ],
)
def test_schedule_checks(entry, check_id, fragment, settings):
    settings.DBQUEUE = {"QUEUES": {"default": {}, "emails": {}}, "SCHEDULE": {"x": entry}}
    errors = check_settings()
    assert [e.id for e in errors] == [check_id]
    assert fragment in errors[0].msg


@pytest.mark.django_db(transaction=True)
def test_status_lists_schedules_with_last_and_next_tick(settings):
    import io
    import json

    from django.core.management import call_command

    settings.DBQUEUE = {
        "QUEUES": {"default": {}, "emails": {}},
        "SCHEDULE": {"nightly": {"cron": "0 3 * * *", "type": "noop"}},
    }
    out = io.StringIO()
    call_command("jobqueue_status", "--json", stdout=out)
    (row,) = json.loads(out.getvalue())["schedules"]
    assert (
        row["name"] == "nightly"
        and row["last_tick"] is None
        and row["next_tick"].endswith("03:00:00+00:00")
    )
    Scheduler().run_once()  # first sight: the row starts at now(), but nothing ticked yet
    out = io.StringIO()
    call_command("jobqueue_status", stdout=out)
    assert "schedule nightly: last tick never, next tick 20" in out.getvalue()
    set_last_tick("nightly", 25 * 3600)  # a 03:00 tick came due in the last 25 hours
    Scheduler().run_once()
    tick = scalar("SELECT idempotency_key FROM dbqueue_job").split(":", 2)[2]
    out = io.StringIO()
    call_command("jobqueue_status", stdout=out)
    assert f"schedule nightly: last tick {tick}," in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_a_pass_with_nothing_due_runs_one_plain_select_and_locks_nothing(settings):
    from django.test.utils import CaptureQueriesContext

    settings.DBQUEUE = {
        "QUEUES": {"default": {}, "emails": {}},
        "SCHEDULE": {
            "nightly": {"cron": "0 3 * * *", "type": "noop"},
            "hourly": {"every": 3600, "type": "noop"},
            "weekly": {"cron": "0 4 * * 1", "type": "noop", "timezone": "Europe/Berlin"},
        },
    }
    scheduler = Scheduler()
    scheduler.run_once()  # first sight: each entry gets its row, starting from now
    assert scalar("SELECT count(*) FROM dbqueue_schedule") == 3
    with CaptureQueriesContext(connection) as queries:
        for _ in range(5):
            assert scheduler.run_once() == {"enqueued": 0, "skipped": 0}
    statements = [q["sql"] for q in queries.captured_queries]
    assert len(statements) == 5, statements  # one per pass, whatever the number of entries
    for statement in statements:
        assert statement.lstrip().upper().startswith("SELECT"), statement
        assert "FOR UPDATE" not in statement.upper()
    # ...and it is not inside a transaction: no BEGIN/COMMIT, so no xid and no flushed commit.
    assert connection.get_autocommit() and not connection.in_atomic_block


@pytest.mark.django_db(transaction=True)
def test_a_due_entry_is_locked_and_ticked_while_the_others_are_only_read(settings):
    from django.test.utils import CaptureQueriesContext

    settings.DBQUEUE = {
        "QUEUES": {"default": {}, "emails": {}},
        "SCHEDULE": {
            "due": {"every": 60, "type": "noop"},
            "idle": {"cron": "0 3 1 1 *", "type": "noop"},
        },
    }
    scheduler = Scheduler()
    scheduler.run_once()
    # One second before the latest tick (ticks are aligned to the epoch): exactly one is due. (A
    # last tick 61 s ago had two ticks in its window once a minute, and failed then.)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE dbqueue_schedule SET last_tick = to_timestamp("
            "floor(extract(epoch FROM now()) / 60) * 60 - 1) WHERE name = 'due'"
        )
        assert cursor.rowcount == 1
    with CaptureQueriesContext(connection) as queries:
        assert scheduler.run_once()["enqueued"] == 1
    locks = [q["sql"] for q in queries.captured_queries if "FOR UPDATE" in q["sql"].upper()]
    assert len(locks) == 1
    assert scalar("SELECT count(*) FROM dbqueue_job") == 1


@pytest.mark.django_db(transaction=True)
def test_status_next_tick_is_the_missed_tick_that_runs_first(settings):
    import io
    import json

    from django.core.management import call_command

    settings.DBQUEUE = {
        "QUEUES": {"default": {}, "emails": {}},
        "SCHEDULE": {"hourly": {"every": 3600, "type": "noop", "catch_up": 1}},
    }
    Scheduler().run_once()
    set_last_tick("hourly", 3 * 3600 + 120)  # three hours down: one missed tick still runs
    out = io.StringIO()
    call_command("jobqueue_status", "--json", stdout=out)
    (row,) = json.loads(out.getvalue())["schedules"]
    now = scalar("SELECT now()")
    next_tick = datetime.datetime.fromisoformat(row["next_tick"])
    assert next_tick < now  # the catch-up tick, not the next hour
    assert now - next_tick < datetime.timedelta(hours=2)


def test_the_sample_in_the_periodic_docs_passes_the_checks_as_pasted(settings):
    """docs/periodic.md's first two blocks, settings.py and jobs.py, exactly as written."""
    import pathlib
    import re

    from django_dbqueue import registry

    text = (pathlib.Path(__file__).parents[2] / "docs" / "periodic.md").read_text()
    settings_block, jobs_block = re.findall(r"```python\n(.*?)```", text, re.S)[:2]
    assert settings_block.startswith("# settings.py") and "@job(" in jobs_block
    namespace = {}
    exec(settings_block, namespace)
    defined = set(registry.all_types())
    try:
        exec(jobs_block, {"__name__": "rates.jobs"})
        # The test app's own types need its queues; the sample's entries are what is checked.
        settings.DBQUEUE = {
            **namespace["DBQUEUE"],
            "QUEUES": {**namespace["DBQUEUE"]["QUEUES"], "emails": {}},
        }
        assert check_settings() == []
        assert {entry["type"] for entry in namespace["DBQUEUE"]["SCHEDULE"].values()} <= set(
            registry.all_types()
        )
    finally:
        for name in set(registry.all_types()) - defined:
            registry.unregister(name)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("cron", ["* * * * * *", "0 0 3 * * *", "* * * * * * *"])
def test_a_six_or_seven_field_settings_entry_never_ticks_every_second(settings, caplog, cron):
    """The issue's entries: croniter reads a sixth field as seconds, so two of them made 24 jobs
    in 12 s. Refused now, the worker ignores the entry (logged), and the five-field entry beside
    it ticks as before."""
    settings.DBQUEUE = {
        "QUEUES": {"default": {}, "emails": {}},
        "SCHEDULE": {
            "quartz": {"cron": cron, "type": "noop"},
            "minutely": {"cron": "* * * * *", "type": "noop"},
        },
    }
    with caplog.at_level("ERROR", logger="django_dbqueue"):
        scheduler = Scheduler()
        scheduler.run_once()  # first sight: the rows start at now()
    assert [s.name for s in scheduler.schedules] == ["minutely"]
    assert any("schedule 'quartz' ignored" in r.getMessage() for r in caplog.records)
    set_last_tick("quartz", 30)
    set_last_tick("minutely", 30)
    counts = scheduler.run_once()
    keys = scalar("SELECT coalesce(array_agg(idempotency_key), '{}') FROM dbqueue_job")
    assert not [k for k in keys if k.startswith("dbqueue-schedule:quartz:")]
    assert counts["enqueued"] == len(keys) <= 1  # at most the minute that began meanwhile


@pytest.mark.parametrize(
    "zone", ["localtime", "posixrules", "Factory", "posix/Europe/Berlin", "right/UTC"]
)
def test_only_iana_zone_names_are_accepted(zone):
    """Files of the zone directory that ZoneInfo loads but that name no IANA zone: the host's
    own zone (``localtime``), tzcode's template, the ``Factory`` placeholder, the duplicate and
    leap-second trees."""
    from django_dbqueue.schedule_parser import ScheduleError, parse_entry

    entry = {"cron": "0 3 * * *", "type": "noop", "timezone": zone}
    with pytest.raises(ScheduleError) as caught:
        parse_entry("nightly", entry, get_settings())
    assert caught.value.field == "timezone"
    assert "is not an IANA time zone name" in str(caught.value)


def test_croniters_names_of_five_field_expressions_are_accepted():
    from django_dbqueue.schedule_parser import parse_entry

    for name in ("@hourly", "@daily", "@midnight", "@weekly", "@monthly", "@yearly"):
        entry = {"cron": name, "type": "noop", "timezone": "UTC"}
        schedule = parse_entry("named", entry, get_settings())
        first = schedule.next_tick(at(2026, 7, 1, 0, 30))
        assert first.second == 0 and first.minute == 0, (name, first)


def test_a_zone_in_the_wrong_case_is_refused_with_the_name_it_means():
    from django_dbqueue.schedule_parser import ScheduleError, parse_entry

    entry = {"cron": "0 3 * * *", "type": "noop", "timezone": "europe/berlin"}
    with pytest.raises(ScheduleError, match="did you mean 'Europe/Berlin'"):
        parse_entry("nightly", entry, get_settings())
    for zone in ("Europe/Berlin", "UTC", "America/Argentina/Buenos_Aires", "US/Eastern"):
        parse_entry("nightly", {**entry, "timezone": zone}, get_settings())
