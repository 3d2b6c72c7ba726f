"""Exactly-once effects on at-least-once delivery, with real worker processes.

A worker is frozen with SIGSTOP (it stops heartbeating, as a worker in a long GC pause or on a
stalled host would) or killed with SIGKILL, so that the same job is delivered twice for real.
"""

import os
import signal

import pytest

from django_dbqueue import enqueue
from tests.acceptance.helpers import effects
from tests.acceptance.settings_fast import FAST_DBQUEUE
from tests.testapp.models import ProviderCall
from tests.utils import job_row, wait_until

pytestmark = [pytest.mark.acceptance, pytest.mark.django_db(transaction=True)]

FAST = "tests.acceptance.settings_fast"


def delivery_state(key):
    from django_dbqueue.models import JobDelivery

    row = JobDelivery.objects.filter(key=key).values_list("state", flat=True).first()
    return row


def test_worker_killed_between_recording_and_confirming_is_never_resent(
    start_worker, settings, tmp_path
):
    settings.DBQUEUE = FAST_DBQUEUE
    flag = tmp_path / "never"
    job = enqueue(
        "deliver-sms", {"key": "sms:kill", "hold_after_send": True, "until_file": str(flag)}
    )
    worker_a = start_worker(settings=FAST, name="A")
    # The provider was called and the worker now sits between the send and the confirmation.
    wait_until(
        lambda: ProviderCall.objects.filter(key="sms:kill").exists(), timeout=20, message="the send"
    )
    os.kill(worker_a.pid, signal.SIGKILL)
    assert worker_a.wait_exit(10) == -signal.SIGKILL

    start_worker(settings=FAST, name="B")
    wait_until(lambda: job_row(job.id)["state"] == "done", timeout=30, message="the retry")
    row = job_row(job.id)
    assert row["attempts"] == 2 and row["errors"][0]["class"] == "LeaseExpired"
    assert row["result"] == {"skipped": "recorded"}  # the retry saw the record and did not send
    assert ProviderCall.objects.filter(key="sms:kill").count() == 1
    assert delivery_state("sms:kill") == "recorded"  # unconfirmed: for a person to resolve


def wait_discarded(worker, job_id):
    """Wait until the frozen worker, woken again, has discarded its run's outcome. Whichever of
    its heartbeat ("lease lost") and its handler's completion or atomic commit ("fenced")
    reaches the database first after SIGCONT finds the lease gone: both threads resume at once,
    and either may win (on a loaded machine the claim loop has been seen to lose)."""
    wait_until(
        lambda: (
            f"lease lost job={job_id}" in worker.stderr()
            or f"fenced job={job_id}" in worker.stderr()
        ),
        timeout=15,
        message=f"worker {worker.name} to discard its outcome",
    )


def test_job_delivered_twice_while_its_first_run_is_frozen_has_one_effect(
    start_worker, settings, tmp_path
):
    settings.DBQUEUE = FAST_DBQUEUE
    flag = tmp_path / "go"
    job = enqueue(
        "deliver-sms", {"key": "sms:frozen", "hold_before_send": True, "until_file": str(flag)}
    )
    worker_a = start_worker(settings=FAST, name="A")
    wait_until(lambda: delivery_state("sms:frozen") == "recorded", timeout=20, message="the record")
    os.kill(worker_a.pid, signal.SIGSTOP)  # no more heartbeats: the lease runs out
    try:
        start_worker(settings=FAST, name="B")
        wait_until(
            lambda: job_row(job.id)["state"] == "done", timeout=30, message="the second delivery"
        )
        assert job_row(job.id)["result"] == {"skipped": "recorded"}
        flag.touch()
    finally:
        os.kill(worker_a.pid, signal.SIGCONT)
    # The first run wakes up, still holds the record, sends once and confirms.
    wait_until(
        lambda: delivery_state("sms:frozen") == "sent", timeout=20, message="the first run's send"
    )
    assert ProviderCall.objects.filter(key="sms:frozen").count() == 1
    wait_discarded(worker_a, job.id)  # its outcome is discarded, not written
    assert job_row(job.id)["attempts"] == 2
    assert job_row(job.id)["result"] == {"skipped": "recorded"}  # the second run's, kept


def test_atomic_handler_whose_lease_was_lost_leaves_none_of_its_rows(
    start_worker, settings, tmp_path
):
    settings.DBQUEUE = FAST_DBQUEUE
    flag = tmp_path / "go"
    job = enqueue("atomic-effect", {"hold_attempts": [1], "until_file": str(flag)})
    worker_a = start_worker(settings=FAST, name="A")
    wait_until(lambda: job_row(job.id)["state"] == "running", timeout=20, message="the first run")
    os.kill(worker_a.pid, signal.SIGSTOP)
    try:
        start_worker(settings=FAST, name="B")
        wait_until(
            lambda: job_row(job.id)["state"] == "done", timeout=30, message="the re-claimed run"
        )
        flag.touch()
    finally:
        os.kill(worker_a.pid, signal.SIGCONT)
    wait_discarded(worker_a, job.id)  # rolled back, and said why
    assert [attempt for _, attempt, _, _ in effects([job.id])] == [2]
    assert job_row(job.id)["attempts"] == 2
