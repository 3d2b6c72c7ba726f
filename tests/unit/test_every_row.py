"""benchmarks/every_row.py: the verdict, the rows read from each script's JSON, the tables."""

from __future__ import annotations

from benchmarks import every_row as er

RATE = er.rate("drain", "jobs/s")
LATENCY = er.latency("wake-up p50")
COUNT = er.count("connections")


def test_slower_only_when_every_run_is_worse_than_every_ref_run():
    assert er.verdict(RATE, [100, 110], [90, 99]) == er.SLOWER
    assert er.verdict(RATE, [100, 110], [90, 100]) == er.WITHIN  # the spreads touch
    assert er.verdict(RATE, [100, 110], [90, 120]) == er.WITHIN
    assert er.verdict(RATE, [100, 110], [111, 130]) == er.FASTER


def test_lower_is_better_for_latency_and_counts():
    assert er.verdict(LATENCY, [1.0, 1.1], [1.2, 1.3]) == er.SLOWER
    assert er.verdict(LATENCY, [1.0, 1.1], [0.8, 0.9]) == er.FASTER
    assert er.verdict(COUNT, [1, 1], [2, 2]) == er.MORE
    assert er.verdict(COUNT, [2, 2], [1, 1]) == er.FEWER
    assert er.verdict(COUNT, [1, 1], [1, 1]) == er.WITHIN


def test_one_run_has_no_spread_and_a_missing_side_no_figure():
    assert er.verdict(RATE, [100], [50, 60]) == "1 run"
    assert er.verdict(RATE, [], [50, 60]) == "no figure"


def test_drain_rows_pair_the_command_with_the_loop_of_the_same_repeat():
    data = {
        "command": [
            {"jobs_per_s": 100.0, "connections": 1},
            {"jobs_per_s": 200.0, "connections": 2},
        ],
        "batch-10": [{"jobs_per_s": 1.0}, {"jobs_per_s": 1.0}],
        "batch-100": [{"jobs_per_s": 400.0}, {"jobs_per_s": 400.0}],
    }
    rows = {row.title: values for row, values in er.drain_rows(data).items()}
    assert rows["drain, run_jobqueue"] == [100.0, 200.0]
    assert rows["drain, run_jobqueue / batch-100 loop"] == [0.25, 0.5]
    assert rows["connections per run_jobqueue process"] == [1, 2]


def test_bench_rows_leave_invalid_runs_out():
    runs = [
        {"workload": "drain", "ours": {"value": 10.0}, "baseline": {"value": 5.0}},
        {"workload": "drain", "invalid": "lost a job"},
        {
            "workload": "enqueue",
            "ours": {"value": 90.0},
            "baseline": {"value": 99.0},
            "django-bare": {"value": 100.0},
        },
        {"workload": "wakeup", "ours": {"p50": 1.0, "p99": 2.0}, "baseline": {}},
    ]
    rows = {row.title: values for row, values in er.bench_rows({"runs": runs}).items()}
    assert rows["drain, in-process burst Worker"] == [10.0]
    assert rows["enqueue, 1 producer"] == [90.0]
    assert rows["enqueue, 1 producer / django-bare"] == [0.9]
    assert rows["wake-up idle p50 (bench.py)"] == [1.0]
    assert rows["wake-up idle p99 (bench.py)"] == [2.0]


def test_fleet_and_idle_rows():
    fleet = {
        "args": {"producers": 8},
        "enqueue": [{"ours": {"tx_s": 50.0}, "django-bare": {"tx_s": 100.0}}],
        "wakeup": [
            {"idle": {"p50_ms": 1.0, "p99_ms": 2.0}, "loaded": {"p50_ms": 3.0, "p99_ms": 4.0}}
        ],
    }
    rows = {row.title: values for row, values in er.fleet_rows(fleet).items()}
    assert rows["enqueue, 8 producers"] == [50.0]
    assert rows["enqueue, 8 producers / django-bare"] == [0.5]
    assert rows["wake-up under load p99 (fleet.py)"] == [4.0]
    mode = {
        "claims_per_job": 1.5,
        "per_process": 1.0,
        "cpu_per_idle_minute": 0.3,
        "wait_p50_ms": 2.0,
        "wait_p99_ms": 9.0,
    }
    idle = {
        "args": {"workers": 20},
        "modes": [{**mode, "mode": "separate"}, {**mode, "mode": "group"}],
    }
    rows = {row.title: values for row, values in er.idle_rows(idle).items()}
    assert rows["claims per job, 20 idle workers, separate processes"] == [1.5]
    assert rows["connections per worker process, 20 idle workers, one group"] == [1.0]


def test_tables_show_median_spread_ratio_and_verdict():
    figures = {
        RATE: {"ref": [100.0, 120.0, 110.0], "this": [80.0, 90.0, 85.0]},
        LATENCY: {"ref": [1.0, 1.2], "this": [1.1]},
        COUNT: {"ref": [1, 1]},
    }
    lines = er.table(figures)
    assert lines[0] == [
        "drain",
        "jobs/s",
        "higher",
        "110 [100..120]",
        "85 [80..90]",
        "0.77x",
        er.SLOWER,
    ]
    assert lines[1][-1] == "1 run"
    assert lines[2][4:] == ["-", "-", "no figure"]
    assert er.worse_rows(lines) == ["drain"]
    text = er.text_table(lines).splitlines()
    assert text[0].startswith("row") and len(text) == 4
    markdown = er.markdown_table(lines).splitlines()
    assert markdown[1] == "|---|---|---|---|---|---|---|"
    assert markdown[2].startswith("| drain | jobs/s | higher | 110 [100..120] |")
