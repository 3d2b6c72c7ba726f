"""benchmarks/soak_check.py, the durable steps' invariants, fed fabricated records, bodies and
runs: a body after its step's record is always caught, a body that finished unrecorded is
caught unless its run died, was a zombie or lost its sessions, and a done job must have every
step of its handler recorded once."""

from __future__ import annotations

import datetime

from benchmarks import soak_check as sc

T0 = datetime.datetime(2026, 12, 5, 12, 0, 0, tzinfo=datetime.UTC)


def at(seconds):
    return T0 + datetime.timedelta(seconds=seconds)


def run(worker="w0.1", started=0.0, ended=10.0, **kwargs):
    return sc.StepRun(
        worker=worker, started=at(started), ended=None if ended is None else at(ended), **kwargs
    )


class Job:
    """One soak-steps job's rows, written the way the handler writes them."""

    def __init__(self, job_id=1):
        self.job = job_id
        self.records, self.bodies = [], []

    def body(self, run_id, start, end=None, key=("reserve", 1), attempt=1):
        name, occurrence = key
        for phase, when in (("start", start), ("end", end)):
            if when is not None:
                self.bodies.append(
                    sc.StepBody(
                        len(self.bodies) + 1,
                        self.job,
                        run_id,
                        name,
                        occurrence,
                        attempt,
                        phase,
                        at(when),
                    )
                )
        return self

    def record(self, run_id, finished, key=("reserve", 1), attempt=1):
        self.records.append(sc.StepRecord(self.job, *key, attempt, at(finished), run_id))
        return self

    def all_steps(self, run_id, begin=0.0, attempt=1):
        """Every step of the handler, run and recorded by ``run_id``, one after another."""
        for i, key in enumerate(sc.STEP_KEYS):
            start = begin + i
            self.body(run_id, start, start + 0.5, key, attempt)
            self.record(run_id, start + 0.6, key, attempt)
        return self


def check(job, runs, faults=(), done=()):
    stats = sc.StepStats()
    found = sc.step_violations(job.records, job.bodies, runs, list(faults), list(done), stats)
    return found, stats


def kinds(found):
    return sorted(kind for kind, _key, _text in found)


def test_a_clean_job_passes():
    job = Job().all_steps(run_id=1)
    keys = [list(key) for key in sc.STEP_KEYS]
    found, stats = check(job, {1: run()}, done=[(1, keys)])
    assert found == []
    assert (stats.started, stats.finished, stats.recorded, stats.jobs_done) == (3, 3, 3, 1)


def test_a_body_that_starts_after_the_record_is_a_violation():
    job = Job().record(1, finished=1.0).body(1, start=0.2, end=0.8)
    job.body(2, start=3.0, end=3.5, attempt=2)  # the next run ran the recorded step again
    found, _ = check(job, {1: run(ended=2.0), 2: run(started=2.5, ended=4.0)})
    assert "step-after-record" in kinds(found)
    text = next(t for k, _key, t in found if k == "step-after-record")
    assert "run 2" in text and "ran again after it was recorded" in text


def test_after_the_record_even_a_zombie_or_a_body_that_raised_is_a_violation():
    job = Job().record(1, finished=1.0).body(1, start=0.2, end=0.8)
    job.body(2, start=1.5)  # started after the record and raised: no end row
    found, _ = check(job, {1: run(ended=2.0), 2: run(started=0.1, ended=None, zombie=True)})
    assert kinds(found) == ["step-after-record"]


def test_a_body_that_finished_unrecorded_in_a_run_that_went_on_is_a_violation():
    job = Job().body(1, start=0.2, end=0.8).record(2, finished=3.6, attempt=2)
    job.body(2, start=3.0, end=3.5, attempt=2)
    found, _ = check(job, {1: run(ended=2.0), 2: run(started=2.5, ended=4.0)})
    assert kinds(found) == ["step-unrecorded"]
    text = found[0][2]
    assert "run 1" in text and "record is run 2's" in text and "runs [2] too" in text


def test_unrecorded_bodies_are_excused_by_a_death_a_zombie_or_terminated_sessions():
    def second_run_recorded(job):
        return job.record(9, finished=3.6, attempt=2).body(9, start=3.0, end=3.5, attempt=2)

    later = run(started=2.5, ended=4.0)
    died = second_run_recorded(Job().body(1, start=0.2, end=0.8))
    assert check(died, {1: run(ended=None, dead=True), 9: later})[0] == []
    zombie = second_run_recorded(Job().body(1, start=0.2, end=0.8))
    assert check(zombie, {1: run(ended=5.0, zombie=True), 9: later})[0] == []
    cut = second_run_recorded(Job().body(1, start=0.2, end=0.8))
    faults = [["terminate", "w0.1", at(0.85), at(0.85)]]
    found, stats = check(cut, {1: run(ended=2.0), 9: later}, faults)
    assert found == [] and stats.again == {"terminated": 1}
    # The same fault on another worker, or long after the run, excuses nothing.
    for fault in (["terminate", "w1.1", at(0.85), at(0.85)], ["terminate", "w0.1", at(9), at(9)]):
        assert kinds(check(cut, {1: run(ended=2.0), 9: later}, [fault])[0]) == ["step-unrecorded"]
    # A run that ended normally but whose process died later is no excuse either.
    assert kinds(check(cut, {1: run(ended=2.0, dead=True), 9: later})[0]) == ["step-unrecorded"]


def test_a_run_still_going_is_not_judged_yet():
    job = Job().body(1, start=0.2, end=0.8)  # its record may be on its way
    assert check(job, {1: run(ended=None)})[0] == []
    assert check(job, {})[0] == []  # a run the checker has not read yet


def test_a_later_run_whose_step_a_zombie_recorded_first_is_excused():
    job = Job().record(1, finished=1.0).body(1, start=0.2, end=0.8)
    job.body(2, start=0.5, end=1.2, attempt=2)  # concurrent with the zombie, before its record
    runs = {1: run(ended=6.0, zombie=True), 2: run(started=0.4, ended=2.0)}
    found, stats = check(job, runs)
    assert found == [] and stats.again == {"recorded by a zombie": 1}


def test_a_done_job_must_have_each_step_recorded_once():
    missing = [["reserve", "1"], ["item", "1"]]
    extra = [*([list(key) for key in sc.STEP_KEYS]), ["item", "3"]]
    found, _ = check(Job(), {}, done=[(1, missing), (2, extra), (3, None)])
    assert kinds(found) == ["step-records"] * 3


def test_a_record_whose_run_wrote_no_end_is_a_violation():
    job = Job().record(1, finished=1.0).body(1, start=0.2)
    assert kinds(check(job, {1: run()})[0]) == ["step-records"]


def test_an_unrecorded_body_of_a_run_handed_back_at_a_sigterms_grace_is_excused():
    # Seed 3535, job 1: w0.1 got SIGTERM 0.1 s into the run; 2 s later it handed the job back
    # unspent (a run still going after the grace), another worker claimed it as attempt 1, and
    # the slow body finished 0.1 s after that: its record was fenced out, as designed
    # (docs/concepts/shutdown.md). The step ran again in the next run.
    job = Job().body(1, start=0.1, end=2.4, key=("item", 2))
    job.body(2, start=2.3, end=4.5, key=("item", 2)).record(2, finished=4.6, key=("item", 2))
    runs = {1: run(started=0.0, ended=2.4), 2: run(worker="w2.1", started=2.3, ended=4.6)}
    faults = [["sigterm", "w0.1", at(0.1), None]]
    found, stats = check(job, runs, faults)
    assert found == [] and stats.again == {"stopped by SIGTERM": 1}
    # A SIGTERM of another worker, or one after the run, excuses nothing.
    for fault in (["sigterm", "w1.1", at(0.1), None], ["sigterm", "w0.1", at(9), None]):
        assert kinds(check(job, runs, [fault])[0]) == ["step-unrecorded"]
