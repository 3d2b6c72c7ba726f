"""The worker registry with real ``run_jobqueue`` processes: two workers appear with their
fields; one killed with ``kill -9`` is shown stale, then is gone within the stated time; one
stopped with SIGTERM is gone at once; ``jobqueue_status --json`` and the metrics list them."""

import io
import json
import signal
import socket
import time
from pathlib import Path

import pytest
from django.core.management import call_command

import django_dbqueue
from django_dbqueue import enqueue, presence
from tests.acceptance.helpers import rows
from tests.utils import wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"


@pytest.fixture(autouse=True)
def fast_dbqueue(settings):
    from tests.acceptance.settings_fast import FAST_DBQUEUE

    settings.DBQUEUE = FAST_DBQUEUE


def status_json():
    out = io.StringIO()
    call_command("jobqueue_status", "--json", stdout=out)
    return json.loads(out.getvalue())


def workers_by_pid():
    return {w["pid"]: w for w in status_json()["workers"]}


def test_two_workers_appear_then_kill_9_goes_stale_and_sigterm_goes_at_once(start_worker, tmp_path):
    one = start_worker("--queues", "default", "--concurrency", "2", settings=FAST, name="one")
    two = start_worker(
        "--queues", "default,emails", "--execution", "process", settings=FAST, name="two"
    )
    shown = wait_until(
        lambda: (w := workers_by_pid()) and {one.pid, two.pid} <= set(w) and w,
        timeout=30,
        message="both workers in jobqueue_status --json",
    )
    first, second = shown[one.pid], shown[two.pid]
    host = socket.gethostname()
    assert first["host"] == second["host"] == host
    assert first["version"] == django_dbqueue.__version__
    assert (first["queues"], first["concurrency"], first["execution"]) == (["default"], 2, "thread")
    assert (second["queues"], second["execution"]) == (["default", "emails"], "process")
    assert second["concurrency"] == 10  # the setting's default
    assert first["group_pid"] is None and first["status"] == "running"
    assert first["worker_id"].startswith(f"{host}:{one.pid}:")
    assert first["heartbeat_age_seconds"] < presence.stale_after(0.25)

    # Jobs running now: what the job table says the worker runs.
    flag = tmp_path / "release"
    job = enqueue("sleep", {"seconds": 60, "until_file": str(flag)})
    holder = wait_until(
        lambda: rows(
            "SELECT worker_id FROM dbqueue_job WHERE id = %s AND state = 'running'", [job.id]
        ),
        timeout=20,
        message="the sleep job to run",
    )[0][0]
    running = wait_until(
        lambda: {w["worker_id"]: w["running"] for w in status_json()["workers"]}.get(holder),
        timeout=10,
        message="the holder to show one running job",
    )
    assert running == 1
    flag.write_text("")

    # kill -9: no goodbye. Shown stale after stale_after, gone after expire_after (from its last
    # heartbeat), whatever the sweeper does meanwhile.
    start = time.monotonic()
    one.kill()
    stale = wait_until(
        lambda: workers_by_pid().get(one.pid, {}).get("status") == "stale" and time.monotonic(),
        timeout=presence.stale_after(0.25) + 5,
        message="the killed worker shown stale",
    )
    assert stale - start >= presence.stale_after(0.25) - 0.5  # not before it missed its beats
    text = io.StringIO()
    call_command("jobqueue_status", stdout=text)
    assert f":{one.pid}:" in text.getvalue() and ": stale," in text.getvalue()
    gone = wait_until(
        lambda: one.pid not in workers_by_pid() and time.monotonic(),
        timeout=presence.expire_after(0.25) + 5,
        message="the killed worker gone from the registry",
    )
    assert gone - start <= presence.expire_after(0.25) + 1.0
    # ... and the live worker's sweeper deleted the row, not just hid it.
    wait_until(
        lambda: not rows("SELECT 1 FROM dbqueue_worker WHERE pid = %s", [one.pid]),
        timeout=5,
        message="the expired row deleted by a sweep",
    )
    assert workers_by_pid()[two.pid]["status"] == "running"

    # SIGTERM: gone at once (before the process has even exited, its row is deleted).
    two.send(signal.SIGTERM)
    assert two.wait_exit(20) == 0
    assert not rows("SELECT 1 FROM dbqueue_worker WHERE pid = %s", [two.pid])
    assert status_json()["workers"] == []


def test_a_processes_group_shows_each_child_with_its_parent(start_worker):
    group = start_worker("--processes", "2", "--concurrency", "1", settings=FAST, name="group")

    def children():
        shown = [w for w in status_json()["workers"] if w["group_pid"] == group.pid]
        return shown if len(shown) == 2 else None

    shown = wait_until(
        children,
        timeout=30,
        message="two children of the group in the registry",
    )
    for w in shown:  # each one a child of the supervisor (in a process group of its own)
        stat = Path(f"/proc/{w['pid']}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[1]) == group.pid
    assert group.pid not in {w["pid"] for w in shown}  # the parent runs no jobs
    group.send(signal.SIGTERM)
    assert group.wait_exit(20) == 0
    assert status_json()["workers"] == []
