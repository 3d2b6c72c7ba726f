"""The claim-timing policy (claim_timing.py), rule by rule, without a database: each test fails
if the rule it names were dropped."""

import pytest

from django_dbqueue.claim_timing import AGAIN, DRAINED, WAIT, ClaimTiming


def timing(concurrency=4, prefetch=None, poll_interval=5.0, burst=False):
    return ClaimTiming(
        concurrency=concurrency, prefetch=prefetch, poll_interval=poll_interval, burst=burst
    )


def claim(
    t, got, asked, *, now=100.0, threads=None, keyed=0, held=False, reopen_in=None, limited=False
):
    """One pass of the loop's claim, as worker.py drives it."""
    t.claiming()
    t.claimed(
        now,
        got=got,
        asked=asked,
        threads=t.concurrency if threads is None else threads,
        keyed=keyed,
        held=held,
        reopen_in=reopen_in,
        limited=limited,
    )
    t.after_claim(got, asked)
    t.poll_from(now)


# -- how many ---------------------------------------------------------------------------------
def test_asks_for_the_threads_plus_the_prefetch_minus_what_is_occupied():
    t = timing(concurrency=4)
    assert (t.prefetch, t.prefetch_max) == (4, 16)
    assert t.free(0) == 8
    assert t.free(5) == 3
    assert t.min_batch == 4


def test_adaptive_prefetch_grows_while_threads_starve_and_falls_back():
    t = timing(concurrency=4)
    t.starved = 3  # handler threads waited on an empty local queue
    t.adapt(8, 8)  # and the claim came back full: a deep backlog
    assert t.prefetch == 8 and t.starved == 0
    t.adapt(12, 12)  # full again, but nobody starved: stay
    assert t.prefetch == 8
    for _ in range(5):
        t.starved = 1
        t.adapt(20, 20)
    assert t.prefetch == 16  # capped at 4x the concurrency
    t.adapt(3, 20)  # the backlog is gone
    assert t.prefetch == 4


def test_a_claim_that_asked_for_nothing_does_not_adapt():
    t = timing(concurrency=4)
    t.starved = 2
    t.adapt(0, 0)
    assert t.prefetch == 4 and t.starved == 2


def test_fixed_prefetch_is_not_adapted():
    t = timing(concurrency=4, prefetch=1)
    t.starved = 5
    t.adapt(5, 5)
    assert t.prefetch == t.prefetch_max == 1
    assert t.free(0) == 5


def test_a_fleet_wide_limit_claims_for_free_threads_only():
    t = timing(concurrency=4)
    t.no_prefetch()
    t.starved = 5
    t.adapt(4, 4)
    assert (t.prefetch, t.prefetch_max) == (0, 0)
    assert t.free(1) == 3
    assert t.min_batch == 2


def test_a_keyed_cut_counts_as_full_for_the_prefetch():
    t = timing(concurrency=4)
    t.starved = 1
    # Short, but the plain claim left keyed jobs out (all its free threads took keyed ones).
    claim(t, got=3, asked=8, threads=2, keyed=2)
    assert t.cut and t.prefetch == 8


# -- when: the start, wake-ups, the poll --------------------------------------------------------
def test_claims_at_once_at_start_and_not_again_until_something_says_so():
    t = timing(poll_interval=5.0)
    assert t.due(0.0)
    claim(t, got=0, asked=8, now=10.0)
    assert not t.due(10.0)
    assert not t.due(14.9)
    assert t.due(15.0)  # the poll


def test_a_wake_up_makes_the_claim_due():
    t = timing()
    claim(t, got=0, asked=8)
    t.wake()
    assert t.due(100.0)


def test_poll_by_only_brings_the_poll_forward():
    t = timing(poll_interval=5.0)
    claim(t, got=0, asked=8, now=10.0)
    t.poll_by(12.0)
    assert t.next_poll == 12.0
    t.poll_by(20.0)
    assert t.next_poll == 12.0


def test_a_rate_window_brings_the_poll_forward_to_its_reopening_with_jitter():
    t = timing(poll_interval=5.0)
    t.claiming()
    t.claimed(
        10.0,
        got=0,
        asked=4,
        threads=4,
        keyed=0,
        held=False,
        reopen_in=1.0,
        limited=True,
        jitter=0.01,
    )
    t.after_claim(0, 4)
    t.poll_from(10.0)
    assert t.reopen_at == pytest.approx(11.01)
    assert t.next_poll == pytest.approx(11.01)
    # The next claim without a window forgets it.
    claim(t, got=0, asked=4, now=12.0, limited=True)
    assert t.reopen_at is None and t.next_poll == 17.0


# -- after a claim ------------------------------------------------------------------------------
def test_a_full_claim_claims_again_at_once():
    t = timing()
    claim(t, got=8, asked=8)
    assert t.want_capacity
    occupied = 8
    assert t.after_result(100.0, claimed=8, asked=8, occupied=occupied, acks_pending=0) == AGAIN
    assert t.claim_next


def test_a_short_claim_waits_for_a_wake_up_or_the_poll():
    t = timing(poll_interval=5.0)
    claim(t, got=3, asked=8)
    assert not t.want_capacity
    assert t.after_result(100.0, claimed=3, asked=8, occupied=3, acks_pending=0) == WAIT
    assert not t.claim_next and t.next_poll == 105.0


def test_a_claim_that_asked_for_nothing_wants_capacity_and_polls_within_half_a_second():
    t = timing(poll_interval=5.0)
    claim(t, got=0, asked=0)
    assert t.want_capacity
    assert t.after_result(100.0, claimed=0, asked=0, occupied=8, acks_pending=0) == WAIT
    assert t.next_poll == 100.5


def test_a_claim_cut_short_by_keyed_jobs_waits_for_capacity_not_for_a_wake_up():
    t = timing(poll_interval=5.0)
    claim(t, got=2, asked=8, threads=2, keyed=2)
    assert t.cut and t.want_capacity
    # Not at once: it would meet the same keys.
    assert t.after_result(100.0, claimed=2, asked=8, occupied=2, acks_pending=0) == WAIT
    assert t.next_poll == 100.5


def test_no_cut_when_keyed_jobs_did_not_fill_the_free_threads_or_a_limit_applies():
    t = timing()
    claim(t, got=3, asked=8, threads=4, keyed=1)
    assert not t.cut
    claim(t, got=0, asked=4, threads=0, limited=True)
    assert not t.cut
    claim(t, got=0, asked=4, threads=0)  # no free thread: every keyed job was left out
    assert t.cut


def test_a_burst_run_ends_on_an_empty_claim_with_nothing_in_flight_or_buffered():
    t = timing(burst=True)
    claim(t, got=0, asked=8)
    assert t.after_result(100.0, claimed=0, asked=8, occupied=0, acks_pending=0) == DRAINED


def test_a_burst_run_writes_its_outcomes_before_it_ends():
    t = timing(burst=True)
    claim(t, got=0, asked=8)
    assert t.after_result(100.0, claimed=0, asked=8, occupied=0, acks_pending=2) == AGAIN
    assert t.claim_next


@pytest.mark.parametrize(
    ("asked", "occupied", "held", "reopen_in"),
    [
        (0, 8, False, None),  # asked for nothing: proves nothing about the queue
        (8, 1, False, None),  # a job still in flight
        (8, 0, True, None),  # a concurrency limit held it back
        (8, 0, False, 1.0),  # a rate window is closed
    ],
)
def test_a_burst_run_does_not_end_while_the_empty_claim_proves_nothing(
    asked, occupied, held, reopen_in
):
    t = timing(burst=True)
    t.claiming()
    t.claimed(
        100.0,
        got=0,
        asked=asked,
        threads=4,
        keyed=0,
        held=held,
        reopen_in=reopen_in,
        limited=held or reopen_in is not None,
    )
    t.after_claim(0, asked)
    assert (
        t.after_result(100.0, claimed=0, asked=asked, occupied=occupied, acks_pending=0) != DRAINED
    )


def test_only_a_burst_run_ends():
    t = timing(burst=False)
    claim(t, got=0, asked=8)
    assert t.after_result(100.0, claimed=0, asked=8, occupied=0, acks_pending=0) == WAIT


# -- a handler finishes ---------------------------------------------------------------------------
def test_a_finish_after_a_short_claim_claims_nothing():
    t = timing()
    claim(t, got=3, asked=8)
    assert not t.finished(keyed=False, occupied=2)
    assert not t.claim_next


def test_a_finish_claims_when_a_backlog_left_the_slots_full_and_half_are_free_again():
    t = timing(concurrency=4)  # 8 slots, a batch is 4
    claim(t, got=8, asked=8)
    assert not t.finished(keyed=False, occupied=5)  # 3 free: not a batch yet
    assert t.finished(keyed=False, occupied=4)
    assert t.claim_next


def test_a_finish_claims_when_a_fleet_wide_limit_held_the_last_claim_back():
    t = timing()
    t.no_prefetch()
    t.claiming()
    t.claimed(100.0, got=1, asked=4, threads=4, keyed=0, held=True, reopen_in=None, limited=True)
    t.after_claim(1, 4)
    assert t.finished(keyed=False, occupied=3)


def test_a_finish_claims_for_a_wake_up_kept_while_every_thread_was_busy():
    t = timing(concurrency=2)
    claim(t, got=3, asked=4)
    assert not t.keep_wakeup(lambda: 2)  # every thread busy: kept for later
    assert t.missed and not t.claim_next
    assert t.finished(keyed=False, occupied=2) is False  # still no free thread
    assert t.finished(keyed=False, occupied=1)
    assert not t.missed and t.claim_next


def test_a_kept_wake_up_is_claimed_at_once_if_a_thread_freed_meanwhile():
    t = timing(concurrency=2)
    assert t.keep_wakeup(lambda: 1)
    assert not t.missed


def test_keep_wakeup_sets_the_flag_before_it_looks_at_the_threads():
    t = timing(concurrency=2)
    seen = []
    t.keep_wakeup(lambda: seen.append(t.missed) or 2)
    assert seen == [True]  # a finish in between sees the flag


def test_keyed_jobs_ending_claim_when_half_the_threads_are_free():
    t = timing(concurrency=4)
    claim(t, got=3, asked=8)
    t.before_claim()
    assert not t.finished(keyed=True, occupied=3)  # 1 thread free of 4
    assert not t.finished(keyed=False, occupied=3)
    assert t.finished(keyed=False, occupied=2)  # a keyed job ended, 2 of 4 free
    assert t.keyed_due and t.claim_next
    assert t.due_for_acks(free=0)  # even with no free slot: the keyed claim is due
    t.claiming()
    assert not t.keyed_due and not t.claim_next


def test_keyed_jobs_ending_claim_when_nothing_is_left():
    t = timing(concurrency=1)
    claim(t, got=1, asked=2)
    t.before_claim()
    assert t.finished(keyed=True, occupied=0)


def test_a_keyed_end_counts_only_until_the_next_claim_takes_the_completions():
    t = timing(concurrency=4)
    claim(t, got=3, asked=8)
    t.finished(keyed=True, occupied=3)
    t.before_claim()
    assert not t.finished(keyed=False, occupied=2)


def test_a_burst_run_claims_when_the_worker_went_idle():
    t = timing(burst=True)
    claim(t, got=2, asked=8)
    assert not t.finished(keyed=False, occupied=1)
    assert t.finished(keyed=False, occupied=0)


# -- while completions wait to be batched --------------------------------------------------------
def test_completions_ride_on_a_due_claim_only_when_it_has_a_free_slot():
    t = timing()
    claim(t, got=3, asked=8)
    assert not t.due_for_acks(free=5)
    t.wake()
    assert t.due_for_acks(free=1)
    assert not t.due_for_acks(free=0)


def test_completions_make_the_claim_due_when_a_backlog_has_a_batch_free():
    t = timing(concurrency=4)
    claim(t, got=8, asked=8)
    t.claim_next = False  # (the loop's claim-again already ran)
    assert not t.due_for_acks(free=3)
    assert t.due_for_acks(free=4)
    assert t.claim_next


# -- what a group listener is told --------------------------------------------------------------
def test_a_backlog_reports_no_free_slots_until_a_batch_fits():
    t = timing(concurrency=4)
    claim(t, got=3, asked=8)
    assert t.reportable_free(1) == 1  # short claim: any free slot may take a woken job
    claim(t, got=8, asked=8)
    assert t.reportable_free(3) == 0
    assert t.reportable_free(4) == 4
