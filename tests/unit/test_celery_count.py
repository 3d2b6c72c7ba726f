"""benchmarks/celery_count.py and the report of benchmarks/celery_compare.py: what keeps the
Celery comparison honest is that a lost or a repeated execution shows. These feed the counting
and the report fabricated runs (no worker, no broker, no database)."""

from __future__ import annotations

import os
import socket
from argparse import Namespace

import pytest

from benchmarks import celery_compare as cc
from benchmarks import celery_count


@pytest.fixture
def count_dir(tmp_path, monkeypatch):
    """This process records into ``tmp_path`` (as a fresh process would)."""
    monkeypatch.setenv(celery_count.COUNT_DIR, str(tmp_path))
    monkeypatch.delenv(celery_count.STARTS_PORT, raising=False)
    monkeypatch.setattr(celery_count, "_pid", None)
    yield tmp_path
    # What the process opened for its runs: its count file and the socket of its starts.
    if celery_count._pid == os.getpid():
        os.close(celery_count._fd)
        if celery_count._starts is not None:
            celery_count._starts[0].close()
    celery_count._pid = None


def test_every_run_of_every_process_is_read_back(count_dir):
    for key in (1, 2, 2):
        celery_count.finished(key, celery_count.started(key))
    # Other processes' files, as Celery's prefork children write theirs: one before this
    # process's runs, one after (perf_counter values).
    (count_dir / "4242.log").write_text("3 0.75 1.0\n1 0.5 0.625\n")
    (count_dir / "4343.log").write_text("4 1e12 1000000000001.5\n")

    tally = celery_count.tally(count_dir)

    assert tally.runs == {"1": 2, "2": 2, "3": 1, "4": 1}
    assert tally.executions == 6
    assert set(tally.processes) == {os.getpid(), 4242, 4343}
    assert tally.processes[os.getpid()][0] == 3
    assert tally.processes[4242] == [2, 0.5, 1.0]
    assert tally.first_start == 0.5  # the earliest start of any process
    assert tally.last_end == 1000000000001.5  # the latest end of any process


def test_lost_repeated_and_unexpected_runs_are_named():
    checked = celery_count.check(range(1, 6), {"1": 1, "2": 3, "4": 1, "9": 1})

    assert checked.lost == ("3", "5")
    assert checked.repeated == 2
    assert checked.unexpected == ("9",)
    assert checked.executions == 6
    assert not checked.clean
    assert checked.describe() == "lost 2, repeated 2, unexpected 1 (lost e.g. 3, 5)"


def test_a_clean_count_is_clean():
    checked = celery_count.check(["-1", 0, 1], {"-1": 1, "0": 1, "1": 1})
    assert checked.clean
    assert checked.describe() == "lost 0, repeated 0"


def test_a_record_cut_short_or_malformed_is_refused(count_dir):
    (count_dir / "10.log").write_text("1 1.0 2.0\n2 1.0")
    with pytest.raises(celery_count.MalformedRecord, match="cut short"):
        celery_count.tally(count_dir)
    (count_dir / "10.log").write_text("1 1.0 2.0\n2 1.0 later\n")
    with pytest.raises(celery_count.MalformedRecord, match=r"10\.log:2: '2 1\.0 later'"):
        celery_count.tally(count_dir)


def test_progress_counts_distinct_keys_of_whole_lines_reading_only_what_is_new(count_dir):
    progress = celery_count.Progress(count_dir)
    path = count_dir / "7.log"
    path.write_text("1 1.0 2.0\n2 1.0")
    assert progress.count() == 1
    with open(path, "a") as f:
        f.write(" 2.0\n3 1.0 2.0\n")
    assert progress.count() == 3
    (count_dir / "8.log").write_text("4 1.0 2.0\n1 3.0 4.0\n")  # 1 again: not one more key
    assert progress.count() == 4
    assert progress.offsets[path] == path.stat().st_size


def test_a_start_is_sent_to_the_harness_when_it_listens(count_dir, monkeypatch):
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(5)
    monkeypatch.setenv(celery_count.STARTS_PORT, str(receiver.getsockname()[1]))
    try:
        at = celery_count.started(17)
        key, sent = receiver.recv(256).decode().split()
    finally:
        receiver.close()
    assert (key, float(sent)) == ("17", at)


def test_the_count_dir_must_be_named(monkeypatch):
    monkeypatch.delenv(celery_count.COUNT_DIR, raising=False)
    monkeypatch.setattr(celery_count, "_pid", None)
    with pytest.raises(RuntimeError, match=celery_count.COUNT_DIR):
        celery_count.started(1)


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------
def run(value, expected, runs, left=0):
    return {"value": value, "check": celery_count.check(expected, runs), "left": left}


def test_the_report_shows_a_lost_and_a_repeated_execution_and_fails_the_run():
    clean = run(1000.0, [1, 2], {"1": 1, "2": 1})
    lost = run(900.0, [1, 2], {"1": 1})
    repeated = run(800.0, [1, 2], {"1": 2, "2": 1}, left=1)
    results = {"drain-1": {"ours": [clean], "celery+redis": [lost, repeated]}}
    runs = [("drain-1", cc.run_drain, 1, "drain of 2 no-op jobs, 1 worker process")]

    text = cc.table(results, runs, ["ours", "celery+redis"])

    assert "| drain of 2 no-op jobs, 1 worker process | jobs/s | 1,000 | 850 [800..900] |" in text
    assert (
        "| drain of 2 no-op jobs, 1 worker process | 0 lost, 0 repeated of 2 "
        "| 1 lost, 1 repeated of 4, 1 left in the queue |"
    ) in text
    assert cc.problems(results) == [
        "  drain-1 celery+redis round 1: lost 1, repeated 0 (lost e.g. 2), left in the queue 0",
        "  drain-1 celery+redis round 2: lost 0, repeated 1, left in the queue 1",
    ]


def test_an_invalid_run_is_left_out_of_the_figures_and_reported():
    results = {
        "wakeup": {
            "ours": [
                {"p50": 1.0, "p99": 2.0, "call_p50": 1.5, "call_p99": 3.0, "left": 0,
                 "check": celery_count.check([1], {"1": 1})},
                {"invalid": "workers not ready after 120s"},
            ]
        }
    }  # fmt: skip
    runs = [("wakeup", cc.run_wakeup, None, "wake-up of an idle worker, 1 jobs")]

    text = cc.table(results, runs, ["ours"])

    assert "| ms | 1.00 |" in text
    assert cc.problems(results) == ["  wakeup ours round 2: INVALID: workers not ready after 120s"]


def test_a_broker_that_does_not_answer_is_named_with_the_command_that_starts_it():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    problem = cc.service_down(f"redis://127.0.0.1:{port}/3")
    assert f"nothing answers at 127.0.0.1:{port}" in problem
    assert "redis-server --daemonize yes" in problem
    assert "rabbitmq-server -detached" in cc.service_down(f"amqp://guest:guest@127.0.0.1:{port}//")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sides", "ours,celery"], "--sides 'ours,celery': choose among"),
        (["--only", "drain,nap"], "--only 'drain,nap': choose among"),
        (["--jobs", "0"], "--jobs must be at least 1, not 0"),
        (["--producers", "1"], "--producers must be at least 2"),
    ],
)
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        cc.parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_plan_runs_each_chosen_workload():
    args = Namespace(only=["drain", "wakeup"], producers=4, jobs=200, wakeups=10)
    assert [label for label, *_ in cc.plan(args)] == ["drain-1", "drain-2", "wakeup"]
