"""The invariant soak (benchmarks/soak.py) with a fixed seed, as part of the suite.

It runs in a subprocess against a database of its own, next to pytest-django's test database
and never that one: ``<DBQUEUE_TEST_DATABASE>_soak`` (``test_dbqueue_soak`` without it), created
when missing and emptied at every run. Four real workers (two per execution mode), a producer,
an operator and faults for ``DBQUEUE_SOAK_MINUTES`` minutes (default 2), then a drain (at
most 60 s, usually a few) and the final check: under three minutes on a two-core machine.
A failure shows the soak's violations and names its worker logs (kept for the post-mortem).

Replay a failure with the command the soak prints first (the same seed, the same schedule).
"""

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.skipif(
        not hasattr(os, "pidfd_open") or not os.path.isdir("/proc/self/task"),
        reason="the soak watches processes and threads through pidfds and /proc (Linux)",
    ),
]

REPO = Path(__file__).resolve().parents[2]
SEED = 20251204
MINUTES = float(os.environ.get("DBQUEUE_SOAK_MINUTES", "2"))
DRAIN = 60.0


def soak_database():
    return f"{os.environ.get('DBQUEUE_TEST_DATABASE') or 'test_dbqueue'}_soak"


def test_every_promise_holds_while_workers_operators_and_faults_interleave(tmp_path):
    command = [
        sys.executable,
        str(REPO / "benchmarks" / "soak.py"),
        "--minutes", str(MINUTES),
        "--seed", str(SEED),
        "--workers", "4",
        "--drain", str(DRAIN),
        "--database", soak_database(),
        "--log-dir", str(tmp_path / "soak"),
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=MINUTES * 60 + DRAIN + 180)
    except subprocess.TimeoutExpired:
        # The soak is stuck: ask it for every thread's stack (faulthandler on SIGUSR1) before
        # it is killed, so that the failure says where.
        process.send_signal(signal.SIGUSR1)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=5)  # the stacks reach the pipe; it goes on running
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(
            f"the soak did not end in time; its last output:\n{stdout[-4000:]}\n"
            f"--- stderr (thread stacks) ---\n{stderr[-12000:]}"
        )
    lines = stdout.strip().splitlines()
    report = "\n".join(lines[-60:]) + ("\n--- stderr ---\n" + stderr[-3000:])
    assert lines and lines[-1] == "violations: 0", report
    assert process.returncode == 0, report
