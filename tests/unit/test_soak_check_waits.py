"""benchmarks/soak_check.py, the durable waits' invariants, fed fabricated calls, signals and
records: a wait that returns another wait's signal, a signal returned by two waits, a timeout
although the wait's signal had committed before the wait read, a sleep that ends early and a
job left waiting for a signal already sent are caught; a late signal, a timeout replayed as the
signal that came after it, a zombie's timeout before the commit and a wait replayed with its
own signal are not."""

from __future__ import annotations

import datetime

from benchmarks import soak_check as sc

T0 = datetime.datetime(2026, 12, 5, 12, 0, 0, tzinfo=datetime.UTC)


def at(seconds):
    return T0 + datetime.timedelta(seconds=seconds)


class Job:
    """One soak-waits job's rows, written the way its handler and the producer write them."""

    def __init__(self, job_id=1):
        self.job = job_id
        self.calls, self.signals, self.records = [], [], []

    def call(self, run, outcome, began, end=None, *, n=1, value=None, kind="signal", attempt=1):
        name = {"signal": "go", "sleep": "nap", "snooze": "snooze"}[kind]
        end = began + 0.05 if end is None else end
        self.calls.append(
            sc.WaitCall(
                len(self.calls) + 1, self.job, run, attempt, kind, name, n, outcome, value,
                at(began), at(end),
            )
        )  # fmt: skip
        return self

    def signal(self, value, seq, committed, *, job=None, held=0.0):
        sent = at((committed or 0.0) - 0.01 - held)
        done = None if committed is None else at(committed)
        self.signals.append(sc.SignalSent(job or self.job, "go", value, seq, held, sent, done))
        return self

    def wait_record(self, n, deadline):
        self.records.append((self.job, "signal:go", n, {"deadline": at(deadline).isoformat()}))
        return self

    def sleep_record(self, until):
        self.records.append((self.job, "sleep:nap", 1, {"until": at(until).isoformat()}))
        return self


def check(*jobs, runs=None):
    stats = sc.WaitStats()
    found = sc.wait_violations(
        [c for j in jobs for c in j.calls],
        [s for j in jobs for s in j.signals],
        [r for j in jobs for r in j.records],
        runs or {},
        stats,
    )
    return found, stats


def kinds(found):
    return sorted(kind for kind, _key, _text in found)


def test_a_clean_job_passes_and_is_counted():
    job = Job().sleep_record(until=1.0).call(1, "suspend", 0.5, kind="sleep")
    job.call(2, "slept", 1.2, kind="sleep").call(2, "snooze", 1.3, kind="snooze")
    job.signal(101, seq=1, committed=0.2)  # sent before the job reached its wait
    job.call(3, "signal", 2.0, value=101)  # returned it at once
    job.wait_record(2, deadline=7.0).call(3, "suspend", 2.1, n=2)  # the run ended at wait #2
    job.signal(102, seq=2, committed=3.0)  # sent while it waited
    job.call(4, "signal", 3.2, value=101).call(4, "signal", 3.3, n=2, value=102)  # #1 replayed
    found, stats = check(job)
    assert found == []
    assert stats.waits == {"signal": 3, "suspend": 1}
    assert (stats.first_reach, stats.after_suspend, stats.snoozes) == (2, 1, 1)
    assert stats.sleeps == {"suspend": 1, "slept": 1} and stats.signals == 2


def test_a_wait_that_returns_another_waits_signal_is_a_violation():
    job = Job().signal(101, seq=1, committed=0.2).signal(102, seq=2, committed=0.3)
    job.call(1, "signal", 1.0, value=102)  # wait #1 took signal #2
    found, _ = check(job)
    assert kinds(found) == ["signal-order"]
    assert "signal #2" in found[0][2] and "its own signal #1 is payload 101" in found[0][2]


def test_another_jobs_signal_or_one_never_sent_is_a_violation():
    mine, other = Job(1), Job(2).signal(201, seq=1, committed=0.2)
    mine.call(1, "signal", 1.0, value=201)  # job 2's signal
    found, _ = check(mine, other)
    assert kinds(found) == ["signal-order"] and "of job 2" in found[0][2]
    stray = Job().call(1, "signal", 1.0, value=999)
    found, _ = check(stray)
    assert kinds(found) == ["signal-order"] and "never sent" in found[0][2]
    assert kinds(check(Job().call(1, "signal", 1.0, value=None))[0]) == ["signal-order"]


def test_a_signal_returned_by_two_waits_is_a_violation():
    job = Job().signal(101, seq=1, committed=0.2)
    job.call(1, "signal", 1.0, value=101).call(1, "signal", 1.1, n=2, value=101)
    found, _ = check(job)
    assert kinds(found) == ["signal-order", "signal-twice"]  # #2 took #1's signal, too
    twice = next(text for kind, _key, text in found if kind == "signal-twice")
    assert "returned by 2 waits" in twice and "#1" in twice and "#2" in twice
    # Two jobs given one signal: the second one's is another job's, and it went to two waits.
    a, b = Job(1).signal(101, seq=1, committed=0.2), Job(2)
    a.call(1, "signal", 1.0, value=101)
    b.call(2, "signal", 1.0, value=101)
    assert kinds(check(a, b)[0]) == ["signal-order", "signal-twice"]


def test_a_wait_replayed_returns_its_signal_again_without_a_violation():
    job = Job().signal(101, seq=1, committed=0.2)
    for run in (1, 2, 3):
        job.call(run, "signal", run * 1.0, value=101, attempt=run)
    assert check(job)[0] == []


def test_a_timeout_although_the_signal_committed_before_the_read_is_a_violation():
    # Committed before the wait's deadline: the read, at or after the deadline, saw it.
    job = Job().wait_record(1, deadline=5.0).call(1, "suspend", 1.0)
    job.signal(101, seq=1, committed=3.0)
    job.call(2, "timeout", 5.1)
    found, _ = check(job, runs={2: sc.StepRun("w1.1", at(5.0), at(6.0))})
    assert kinds(found) == ["signal-timeout"]
    assert "worker w1.1" in found[0][2] and "committed by" in found[0][2]
    # Committed before the call began (a deadline not known to the checker): the same.
    job = Job().signal(101, seq=1, committed=3.0).call(2, "timeout", 5.1)
    assert kinds(check(job)[0]) == ["signal-timeout"]


def test_a_wait_that_returned_the_signal_proves_it_committed():
    # The producer's commit time is unknown (it died first), but run 2 returned the signal at 2.0:
    # committed by then, so run 3's timeout from a read after 4.0 is a violation, a zombie's too.
    job = Job().signal(101, seq=1, committed=None)
    job.call(2, "signal", 1.9, 2.0, value=101).wait_record(1, deadline=4.0)
    job.call(3, "timeout", 4.5)
    runs = {3: sc.StepRun("w0.2", at(4.4), None, zombie=True)}
    found, _ = check(job, runs=runs)
    assert kinds(found) == ["signal-timeout"] and "a zombie" in found[0][2]


def test_timeouts_the_facts_allow_are_not_flagged():
    # The signal committed after the deadline and after the call began: a late signal.
    late = Job().wait_record(1, deadline=5.0).call(1, "suspend", 1.0)
    late.call(2, "timeout", 5.1).signal(101, seq=1, committed=5.2)
    late.call(3, "signal", 9.0, value=101, attempt=2)  # the retry's replay finds it: allowed
    assert check(late)[0] == []
    # The commit returned just after the read began: it may not have been visible.
    close = Job().wait_record(1, deadline=5.0).signal(101, seq=1, committed=5.15)
    close.call(2, "timeout", 5.1)
    assert check(close)[0] == []
    # No signal of its own (#2) was sent: signal #1 belongs to wait #1.
    fewer = Job().signal(101, seq=1, committed=0.5).call(1, "signal", 1.0, value=101)
    fewer.wait_record(2, deadline=6.0).call(1, "suspend", 1.1, n=2).call(2, "timeout", 6.1, n=2)
    assert check(fewer)[0] == []
    # A signal refused (the job had finished: seq None) is no signal of its own either.
    refused = Job().signal(101, seq=None, committed=0.5).call(1, "timeout", 6.1)
    found, stats = check(refused)
    assert found == [] and (stats.refused, stats.signals) == (1, 0)


def test_a_sleep_that_returns_before_its_recorded_end_is_a_violation():
    early = Job().sleep_record(until=2.0).call(2, "slept", 1.5, 1.6, kind="sleep")
    assert kinds(check(early)[0]) == ["sleep-early"]
    unrecorded = Job().call(2, "slept", 1.5, 1.6, kind="sleep")
    found, _ = check(unrecorded)
    assert kinds(found) == ["sleep-early"] and "no record" in found[0][2]
    on_time = Job().sleep_record(until=2.0).call(2, "slept", 1.95, 2.01, kind="sleep")
    assert check(on_time)[0] == []


def test_a_job_waiting_for_a_signal_already_committed_is_unheard():
    found = sc.unheard_violations([(7, 2, at(1.0), at(8.0), at(3.0))])
    assert kinds(found) == ["signal-unheard"]
    assert "job 7" in found[0][2] and "#2" in found[0][2]
    assert sc.unheard_violations([]) == []
