"""Tick arithmetic without a database: intervals, cron wall-clock time, both DST transitions."""

import datetime

import pytest

from django_dbqueue.schedule import Schedule, wall_to_instant

UTC = datetime.UTC


def at(*args):
    return datetime.datetime(*args, tzinfo=UTC)


def berlin(cron, **kwargs):
    return Schedule(name="s", type="noop", cron=cron, timezone="Europe/Berlin", **kwargs)


def test_a_wall_time_repeated_by_the_fall_back_runs_once_at_its_first_occurrence():
    # 2026-10-25, Europe/Berlin: 03:00 CEST (01:00 UTC) becomes 02:00 CET; 02:30 happens at
    # 00:30 UTC and again at 01:30 UTC.
    s = berlin("30 2 * * *")
    ticks = s.ticks_between(at(2026, 10, 24, 12), at(2026, 10, 26, 12), 10)
    assert ticks == [at(2026, 10, 25, 0, 30), at(2026, 10, 26, 1, 30)]
    # Wherever a pass starts or ends inside the repeated hour, the tick is not found again.
    for start in (at(2026, 10, 25, 0, 30), at(2026, 10, 25, 1, 0), at(2026, 10, 25, 1, 29)):
        assert s.ticks_between(start, at(2026, 10, 25, 12), 10) == []
    assert len({s.key(t) for t in ticks}) == 2


def test_ticks_before_sees_a_first_occurrence_from_inside_the_second_pass():
    s = berlin("30 2 * * *")
    # 01:20 UTC is 02:20 CET, in the second pass; the 02:30 tick already ran at 00:30 UTC.
    assert s.ticks_before(at(2026, 10, 25, 1, 20), 1, at(2026, 10, 1)) == [at(2026, 10, 25, 0, 30)]


def test_a_wall_time_skipped_by_the_spring_forward_runs_once_when_the_clock_jumps():
    # 2026-03-29, Europe/Berlin: 02:00 CET (01:00 UTC) becomes 03:00 CEST; 02:30 never happens.
    s = berlin("30 2 * * *")
    ticks = s.ticks_between(at(2026, 3, 28, 12), at(2026, 3, 30, 12), 10)
    assert ticks == [at(2026, 3, 29, 1, 0), at(2026, 3, 30, 0, 30)]
    every_quarter = berlin("*/15 2 * * *")  # four skipped times make one tick
    assert every_quarter.ticks_between(at(2026, 3, 29), at(2026, 3, 29, 3), 10) == [
        at(2026, 3, 29, 1, 0)
    ]
    assert every_quarter.ticks_before(at(2026, 3, 29, 3), 5, at(2026, 3, 27, 3)) == [
        at(2026, 3, 28, 1, 0),
        at(2026, 3, 28, 1, 15),
        at(2026, 3, 28, 1, 30),
        at(2026, 3, 28, 1, 45),
        at(2026, 3, 29, 1, 0),
    ]


@pytest.mark.parametrize(
    ("day", "count"), [((2026, 3, 29), 23), ((2026, 10, 25), 24), ((2026, 7, 1), 24)]
)
def test_hourly_cron_runs_once_per_wall_clock_hour(day, count):
    s = berlin("0 * * * *")
    zone = s._zone()
    start = datetime.datetime(*day, tzinfo=zone).astimezone(UTC)
    end = (datetime.datetime(*day, tzinfo=zone) + datetime.timedelta(days=1)).astimezone(UTC)
    ticks = s.ticks_between(start - datetime.timedelta(seconds=1), end, 100)
    ticks = [t for t in ticks if t < end]
    assert len(ticks) == count
    assert ticks == sorted(set(ticks))


def test_wall_to_instant_in_a_zone_with_a_half_hour_shift():
    from zoneinfo import ZoneInfo

    lord_howe = ZoneInfo("Australia/Lord_Howe")  # +10:30 <-> +11:00
    # 2026-10-04 02:00 local jumps to 02:30: 02:10 does not exist.
    instant = wall_to_instant(datetime.datetime(2026, 10, 4, 2, 10), lord_howe)
    assert instant.astimezone(lord_howe).replace(tzinfo=None) == datetime.datetime(
        2026, 10, 4, 2, 30
    )


def test_intervals_are_real_time_and_ignore_daylight_saving():
    s = Schedule(name="s", type="noop", every=3600)
    ticks = s.ticks_between(at(2026, 10, 24, 23, 30), at(2026, 10, 25, 3, 30), 10)
    assert ticks == [at(2026, 10, 25, h) for h in range(4)]


def test_due_plans_catch_up_and_skips():
    s = Schedule(name="s", type="noop", every=3600, catch_up=2, misfire_grace=60)
    due = s.due(at(2026, 1, 1, 0), at(2026, 1, 1, 10, 0, 30), limit=100, count_limit=100)
    # 01:00..09:00 were missed: the newest two of them run, seven are skipped; 10:00 is on time.
    assert due.ticks == [at(2026, 1, 1, 8), at(2026, 1, 1, 9), at(2026, 1, 1, 10)]
    assert due.skipped == 7
    assert due.advance_to == at(2026, 1, 1, 10)


# The catch-up policies: ten hourly ticks missed (01:00..10:00), the pass at 10:00:30.
MISSED_FROM, PASS_AT = at(2026, 1, 1, 0), at(2026, 1, 1, 10, 0, 30)


def hourly(**kwargs):
    return Schedule(name="s", type="noop", every=3600, misfire_grace=10, **kwargs)


@pytest.mark.parametrize(
    ("catch_up", "window", "hours", "skipped"),
    [
        (0, None, [], 10),  # "none"
        (1, None, [10], 9),  # "latest"
        ("all", 3 * 3600, [8, 9, 10], 7),  # every one within the last three hours
        ("all", 86400, list(range(1, 11)), 0),
    ],
)
def test_catch_up_policies(catch_up, window, hours, skipped):
    extra = {} if window is None else {"catch_up_window": window}
    due = hourly(catch_up=catch_up, **extra).due(MISSED_FROM, PASS_AT, limit=100, count_limit=100)
    assert due.ticks == [at(2026, 1, 1, h) for h in hours]
    assert due.skipped == skipped == len(due.missed)
    assert due.advance_to == (
        due.ticks[-1] if due.ticks else PASS_AT - datetime.timedelta(seconds=10)
    )


def test_catch_up_all_runs_a_long_backlog_over_several_passes_in_order():
    s = hourly(catch_up="all", catch_up_window=86400)
    first = s.due(MISSED_FROM, PASS_AT, limit=4, count_limit=100)
    assert first.ticks == [at(2026, 1, 1, h) for h in (1, 2, 3, 4)]
    assert first.advance_to == at(2026, 1, 1, 4)  # not past the ticks still to run
    second = s.due(first.advance_to, PASS_AT, limit=100, count_limit=100)
    assert second.ticks == [at(2026, 1, 1, h) for h in range(5, 11)]


def test_on_time_ticks_run_whatever_the_policy():
    s = Schedule(name="s", type="noop", every=60, misfire_grace=600, catch_up=0)
    due = s.due(at(2026, 1, 1, 0), at(2026, 1, 1, 0, 5, 30), limit=100, count_limit=100)
    assert len(due.ticks) == 5 and due.skipped == 0
