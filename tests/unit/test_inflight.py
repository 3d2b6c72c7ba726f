"""What a worker holds (django_dbqueue/inflight.py): which entries the shutdown hands back after
the grace, and so which attempts are given back (no database)."""

import types

from django_dbqueue.inflight import Entry, Inflight


def entry(job_id, *, started=True, exclusive=False, timeout=None):
    ctx = types.SimpleNamespace(id=job_id, queue="default", cancelled=False)
    held = Entry(ctx, token=job_id * 10, timeout=timeout, exclusive=exclusive)
    if started:
        held.started = 0.0  # long ago: past any timeout
    return held


def inflight_with(*entries):
    inflight = Inflight()
    inflight.add(entries)
    return inflight


def test_process_mode_never_hands_back_a_run_past_its_timeout():
    """Process mode kills every run's child before the release, so it hands back every run
    still going, except one past its timeout: that attempt counts, and its failure is written
    once its child is dead (Worker.finished). It used to be released with its attempt given
    back when the grace ended before the watchdog's kill had been seen."""
    timed_out, running, unstarted = entry(1, timeout=1.0), entry(2), entry(3, started=False)
    inflight = inflight_with(timed_out, running, unstarted)
    assert inflight.expire(keep=lambda e: True) == [timed_out]  # process mode keeps its lease

    released, kept = inflight.release_all(runs_are_killed=True)

    assert (released, kept) == ([running, unstarted], [])
    assert not timed_out.released and timed_out.holds_lease
    assert running.released and unstarted.released


def test_thread_mode_keeps_what_may_still_run_beside_a_second_run():
    """A thread cannot be stopped: an exclusive run (a fleet-wide limit or a serial key counts
    it) and a run past its timeout whose failure waits for its end stay claimed; the rest is
    handed back."""
    exclusive, plain = entry(1, exclusive=True), entry(2)
    timed_out = entry(3, exclusive=True, timeout=1.0)
    inflight = inflight_with(exclusive, plain, timed_out)
    inflight.expire(keep=lambda e: e.exclusive)

    released, kept = inflight.release_all(runs_are_killed=False)

    assert (released, kept) == ([plain], [exclusive, timed_out])
