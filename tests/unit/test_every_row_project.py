"""benchmarks/every_row.py's rows of drain_project.py (issue 37's second harness)."""

from __future__ import annotations

from benchmarks import every_row as er


def run(variant, side, jobs_per_s, server_us=0.0, client_us=0.0):
    return {
        "variant": variant,
        "side": side,
        "jobs_per_s": jobs_per_s,
        "server_us": server_us,
        "client_us": client_us,
    }


def test_project_rows_read_each_variant_and_pair_the_loop_of_the_same_repeat():
    runs = [
        run("during", "command", 100.0, server_us=250.0, client_us=60.0),
        run("during", "seed-10", 400.0),
        run("after", "command", 300.0, server_us=70.0, client_us=55.0),
        run("after", "seed-10", 390.0),
        run("during", "command", 200.0, server_us=240.0, client_us=62.0),
        run("during", "seed-10", 500.0),
        run("after", "command", 310.0, server_us=72.0, client_us=54.0),
        run("after", "seed-10", 480.0),
    ]
    rows = {row.title: (row, values) for row, values in er.project_rows({"runs": runs}).items()}
    assert rows["drain, project's run_jobqueue while enqueue_many() fills"][1] == [100.0, 200.0]
    assert rows["drain, project's run_jobqueue started after the fill"][1] == [300.0, 310.0]
    cpu_row, cpu = rows["server CPU per job, run_jobqueue while enqueue_many() fills"]
    assert cpu == [250.0, 240.0]
    assert not cpu_row.higher_is_better  # more CPU per job is worse
    assert er.verdict(cpu_row, [60.0, 70.0], cpu) == er.MORE
    assert rows["worker CPU per job, run_jobqueue while enqueue_many() fills"][1] == [60.0, 62.0]
    # The command while the fill runs over the seed's loop of the same repeat, not the after's.
    assert rows["drain while enqueue_many() fills / seed's batch-10 loop"][1] == [0.25, 0.4]


def test_the_project_suite_runs_both_variants_as_every_row_splits_its_arguments():
    suite = next(s for s in er.SUITES if s.name == "project")
    for args in (suite.default, suite.quick):
        words = args.split()  # every_row.py splits the arguments on spaces
        assert "--variant" in words
        variants = [words[i + 1] for i, word in enumerate(words) if word == "--variant"]
        assert variants == ["during=", "after=--start=after"]
