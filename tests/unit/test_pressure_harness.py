"""benchmarks/pressure.py's pure parts, without a database: the claim, producer and record files
as the worker launcher and the producer write them, the phases, the percentiles and the ratio."""

import pytest

from benchmarks import pressure
from benchmarks.pressure_worker import ClaimLog


def test_the_claim_lines_the_launcher_writes_read_back(tmp_path):
    log = ClaimLog(str(tmp_path))
    log.add(100.25, 0.0012345, 7, 10, 3)
    log.add(101.5, 0.5, 0, 10, 0)
    log.flush()
    (path,) = tmp_path.glob("claims-*.txt")
    lines = [*path.read_text().splitlines(), "102.0 0.001 3"]  # a line cut while written
    claims, skipped = pressure.parse_claims(lines)
    assert claims == [
        pressure.Claim(100.25, 0.001234, 7, 10, 3),
        pressure.Claim(101.5, 0.5, 0, 10, 0),
    ]
    assert skipped == 1


def test_producer_and_record_lines():
    assert pressure.parse_commits(["10.5 8", "", "11.0 2"]) == [(10.5, 8), (11.0, 2)]
    # noop/records.py writes repr(time) and the key
    assert list(pressure.parse_records(["1733475600.123456 5", "bad", "2.0 6"])) == [
        (1733475600.123456, 5),
        (2.0, 6),
    ]


def test_percentiles():
    assert pressure.percentiles([]) == (None, None)
    assert pressure.percentiles([0.004]) == (0.004, 0.004)
    values = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    p50, p99 = pressure.percentiles(values)
    assert p50 == pytest.approx(0.0505)
    assert p99 == pytest.approx(0.09901)


def test_a_phase_is_start_inclusive_and_phases_do_not_overlap():
    t = pressure.Timeline()
    t.add("clean", 10.0, 20.0)
    t.add("hold", 20.0, 30.0)
    assert [t.phase_of(x) for x in (9.99, 10.0, 19.99, 20.0, 29.99, 30.0)] == [
        None,
        0,
        0,
        1,
        1,
        None,
    ]
    with pytest.raises(ValueError, match="starts before"):
        t.add("recovery", 29.0, 40.0)
    with pytest.raises(ValueError, match="ends before"):
        t.add("recovery", 40.0, 39.0)


def test_summarize_puts_everything_in_its_phase_and_leaves_snapshot_claims_out():
    t = pressure.Timeline()
    t.add("clean", 0.0, 10.0)
    t.add("hold", 10.0, 20.0)
    t.blackout(19.0, 20.0)  # the hold's end-of-phase snapshot
    claims = [
        pressure.Claim(1.0, 0.001, 10, 10, 0),
        pressure.Claim(2.0, 0.003, 0, 10, 5),  # empty
        pressure.Claim(3.0, 0.002, 0, 0, 5),  # asked for nothing: only wrote completions
        pressure.Claim(11.0, 0.010, 4, 10, 0),
        pressure.Claim(19.5, 9.0, 4, 10, 0),  # during the snapshot: not timed
        pressure.Claim(25.0, 1.0, 4, 10, 0),  # after the last phase
    ]
    commits = [(0.5, 50), (9.9, 50), (10.0, 20), (30.0, 99)]
    records = [(1.0, 0), (2.0, 1), (12.0, 2), (12.5, 3), (40.0, 4)]
    phases, check = pressure.summarize(t, claims, commits, records, total_keys=5)
    clean, hold = phases
    assert (clean["offered"], clean["completed"], clean["claims"]) == (100, 2, 2)
    assert clean["offered_per_s"] == 10.0 and clean["completed_per_s"] == 0.2
    assert clean["claim_p50_ms"] == pytest.approx(2.0)
    assert clean["jobs_per_claim"] == 5.0 and clean["empty_claims"] == 0.5
    # the claims that wrote no completions in the same round trip, apart
    assert clean["bare_claims"] == 1 and clean["bare_p99_ms"] == pytest.approx(1.0)
    assert (hold["offered"], hold["completed"], hold["claims"]) == (20, 2, 1)
    assert hold["claims_in_snapshots"] == 1
    assert hold["claim_p99_ms"] == pytest.approx(10.0)
    assert check == {"missing": 0, "repeated": 0, "unexpected": 0}
    assert pressure.ratio(phases, "claim_p99_ms", "hold", "clean") == pytest.approx(
        10.0 / clean["claim_p99_ms"]
    )


def test_summarize_counts_keys_that_never_ran_ran_twice_or_were_never_enqueued():
    t = pressure.Timeline()
    t.add("clean", 0.0, 10.0)
    records = [(1.0, 0), (2.0, 0), (3.0, 2), (4.0, 7)]
    _phases, check = pressure.summarize(t, [], [], records, total_keys=4)
    assert check == {"missing": 2, "repeated": 1, "unexpected": 1}


def test_a_phase_without_claims_has_no_percentile_and_no_ratio():
    t = pressure.Timeline()
    t.add("clean", 0.0, 10.0)
    t.add("hold", 10.0, 20.0)
    phases, check = pressure.summarize(t, [pressure.Claim(1.0, 0.002, 1, 1, 0)], [], [])
    assert check is None
    assert phases[1]["claim_p99_ms"] is None and phases[1]["jobs_per_claim"] is None
    assert phases[1]["bare_p99_ms"] is None
    assert "-" in pressure.phase_table(phases)[2]
    assert pressure.ratio(phases, "claim_p99_ms", "hold", "clean") is None
    assert pressure.fmt_ratio(None) == "n/a"


def test_the_report_keeps_the_tables_the_run_wrote_and_names_those_it_read():
    def table(size, dead, written, read):
        return {
            "kind": "table",
            "size": size,
            "dead": dead,
            "written": written,
            "read": read,
            "n_dead_tup": dead,
            "vacuums": 0,
        }

    def snap(label, worker_writes, queue_reads):
        return {
            "label": label,
            "seconds": 0.1,
            "oldest_xmin_age": None,
            "relations": {
                "dbqueue_job": table(8192, 3, 5, 5),
                "dbqueue_job_pkey": {
                    "kind": "index",
                    "table": "dbqueue_job",
                    "size": 8192,
                    "dead": 0,
                },
                "dbqueue_queue": table(0, 0, 0, queue_reads),
                "dbqueue_step": table(0, 0, 9, 9),
                "dbqueue_worker": table(8192, 1, worker_writes, 0),
            },
        }

    snapshots = [snap("end clean", 10, 100), snap("end hold", 12, 150)]
    names, read = pressure.touched(snapshots)
    assert names == ["dbqueue_job", "dbqueue_job_pkey", "dbqueue_worker"]
    assert read == ["dbqueue_queue"]
    text = "\n".join(pressure.relation_tables(snapshots))
    assert "dbqueue_step" not in text and "  dbqueue_job_pkey" in text
    assert "tables read, not written: dbqueue_queue" in text


def test_options():
    args = pressure.parse_args(["--rate", "100", "--workers", "4", "--no-private-cluster"])
    assert args.mode == "pressure" and args.rate == 100.0
    assert pressure.parse_args(["--backlog", "20000"]).mode == "backlog"
    assert pressure.parse_args(["--database-url", "postgres://x/y"]).private_cluster is False
    with pytest.raises(SystemExit):
        pressure.parse_args(["--backlog", "10", "--queues", "5"])
    with pytest.raises(SystemExit):  # its tables are emptied: the name says so
        pressure.parse_args(["--no-private-cluster", "--database", "production"])
    with pytest.raises(SystemExit):
        pressure.parse_args(["--pg-option", "shared_buffers"])


def test_the_private_cluster_has_a_connection_per_handler_thread():
    assert pressure.worker_concurrency("") == 10
    assert pressure.worker_concurrency("--concurrency 40") == 40
    assert pressure.worker_concurrency("--poll-interval 1 --concurrency=4") == 4
