"""Process mode's handler children (``--execution process``), with real ``run_jobqueue``
processes: a child that ignores SIGTERM is killed after the grace, and dead before its job is
handed back; a child that exits on its own is reported with its real exit code."""

import signal
from pathlib import Path

import pytest

from django_dbqueue import enqueue
from tests.acceptance.helpers import effects
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.utils import job_row, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"  # SHUTDOWN_GRACE 3 s
GRACE = FAST_DBQUEUE["SHUTDOWN_GRACE"]


@pytest.fixture(autouse=True)
def fast_leases(settings):
    settings.DBQUEUE = FAST_DBQUEUE  # leases are fixed at enqueue time


def running_pid(pid):
    """Whether ``pid`` is a process that still runs (a zombie has stopped running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("group", [False, True], ids=["alone", "under-processes"])
def test_a_child_that_ignores_sigterm_is_killed_before_its_job_is_handed_back(start_worker, group):
    job_id = enqueue("ignore-sigterm").id
    args = ["--concurrency", "1", "--execution", "process"]
    worker = start_worker(*args, *(["--processes", "2"] if group else []), settings=FAST)
    wait_until(lambda: effects([job_id]), timeout=30, message="the handler to start")
    child_pid = effects([job_id])[0][3]
    assert running_pid(child_pid)

    worker.send(signal.SIGTERM)
    # The job goes back once the grace is over; by then its handler's process is gone.
    wait_until(
        lambda: job_row(job_id)["state"] != "running",
        timeout=GRACE + 20,
        message="the job handed back",
    )
    child_alive = running_pid(child_pid)
    row = job_row(job_id)
    assert not child_alive, "the job was handed back while its handler process still ran"
    assert worker.wait_exit(30) == 0, worker.output()
    assert (row["state"], row["attempts"]) == ("pending", 0), row
    assert not running_pid(child_pid)
    assert "killing the handler process" in worker.stderr(), worker.output()


def test_a_child_that_exits_on_its_own_is_reported_with_its_exit_code(start_worker):
    job_id = enqueue("exit-process", {"code": 1}).id
    worker = start_worker("--concurrency", "1", "--execution", "process", "--burst", settings=FAST)
    assert worker.wait_exit(60) == 0, worker.output()
    row = job_row(job_id)
    assert row["state"] == "dead", row
    message = row["errors"][0]["message"]
    assert "the handler process died while running the job (exit code 1)" in message, message
