"""benchmarks/celery_compare.py, our side only, at a tiny size: every workload runs real
``run_jobqueue`` processes and producer processes, and every job that should run is counted
exactly once.

The Celery sides are not run here: they need the benchmark's own venv (Celery from PyPI) and
Redis and RabbitMQ, which CI does not provide; the counting and the report they share with our
side are tested in tests/unit/test_celery_count.py with fabricated lost and repeated runs.

The script runs in a subprocess against a database of its own, never pytest-django's test
database: ``<DBQUEUE_TEST_DATABASE>_celery`` (``test_dbqueue_celery`` without it), created and
migrated when missing and emptied before every run. About 20 seconds on two cores.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.acceptance

REPO = Path(__file__).resolve().parents[2]
EXPECTED = {"drain-1": 200, "drain-2": 200, "view-1": 40, "view-2": 40, "wakeup": 11}


def test_our_side_runs_every_job_of_every_workload_exactly_once(tmp_path):
    database = f"{os.environ.get('DBQUEUE_TEST_DATABASE') or 'test_dbqueue'}_celery"
    command = [
        sys.executable,
        str(REPO / "benchmarks" / "celery_compare.py"),
        "--sides", "ours",
        "--rounds", "1",
        "--jobs", "200",
        "--view-tx", "40",
        "--producers", "2",
        "--wakeups", "10",
        "--gap", "0.005",
        "--stall", "30",
        "--database", database,
        "--log-dir", str(tmp_path / "logs"),
        "--json", str(tmp_path / "result.json"),
    ]  # fmt: skip
    done = subprocess.run(
        command,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    output = f"{done.stdout[-6000:]}\n--- stderr ---\n{done.stderr[-3000:]}"
    assert done.returncode == 0, output

    results = json.loads((tmp_path / "result.json").read_text())["results"]
    assert set(results) == set(EXPECTED), output
    for label, expected in EXPECTED.items():
        (run,) = results[label]["ours"]
        assert "invalid" not in run, (label, output)
        assert run["check"] == {
            "expected": expected,
            "executions": expected,
            "lost": 0,
            "repeated": 0,
            "unexpected": 0,
        }, (label, output)
        assert run["left"] == 0, (label, output)
    for label in ("drain-1", "drain-2", "view-1", "view-2"):
        assert results[label]["ours"][0]["value"] > 0, (label, output)
    assert results["view-2"]["ours"][0]["committed"] == 40, output
    assert 0 < results["wakeup"]["ours"][0]["p50"] <= results["wakeup"]["ours"][0]["p99"], output
    assert "| drain of 200 no-op jobs, 2 worker processes | 0 lost, 0 repeated of 200 |" in (
        done.stdout
    ), output
