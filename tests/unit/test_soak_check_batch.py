"""benchmarks/soak_batch.py, the batch-handler invariant, fed fabricated jobs: a clean run passes
(faults' and operators' entries allowed), and each crafted violation is caught: a failure or a
result that is a batch mate's, a success on an attempt the job's plan fails, a dead job with
attempts left, a success written twice."""

from __future__ import annotations

from benchmarks import soak_batch as sb


def planned(job_id, attempt, entry_attempt=None):
    return {
        "attempt": attempt if entry_attempt is None else entry_attempt,
        "class": "RuntimeError",
        "message": sb.planned_failure(job_id, attempt),
    }


def lease_expired(attempt):
    return {"attempt": attempt, "class": "LeaseExpired", "message": "lease expired at ..."}


def batch_job(job_id, fail=(), state="done", attempts=None, errors=None, result=None, done=None):
    fail = list(fail)
    if attempts is None:
        attempts = len(fail) + 1 if state == "done" else 3
    if errors is None:
        errors = [planned(job_id, a) for a in fail if a <= attempts]
    if result is None and state == "done":
        result = {"job": job_id, "attempt": attempts, "batch": 5}
    if done is None:
        done = 1 if state == "done" else 0
    return sb.BatchJob(job_id, fail, state, attempts, 3, errors, result, done)


def clean():
    return [
        batch_job(1),
        batch_job(2, fail=[1]),
        batch_job(3, fail=[1, 2]),
        batch_job(4, fail=[1, 2, 3], state="dead"),
        # A kill took its first attempt's lease; its second ran clean.
        batch_job(5, attempts=2, errors=[lease_expired(1)]),
        batch_job(6, state="cancelled", attempts=1, errors=[]),
        batch_job(7, state="pending", attempts=1, fail=[1]),
    ]


def kinds(found):
    return sorted(kind for kind, _key, _text in found)


def test_a_clean_run_passes_and_is_counted():
    stats = sb.BatchStats()
    assert sb.batch_violations(clean(), stats) == []
    assert stats.jobs == 7
    assert stats.states == {"done": 4, "dead": 1, "cancelled": 1, "pending": 1}
    assert stats.planned == 1 + 2 + 3 + 1
    assert stats.sizes == {5: 4}


def test_a_failure_of_a_batch_mate_is_caught():
    jobs = clean()
    # Job 1's plan never fails, yet it failed its first attempt with job 2's failure.
    jobs[0] = batch_job(1, attempts=2, errors=[planned(2, 1)])
    # Job 2's own message, but on an attempt its plan does not fail.
    jobs[1] = batch_job(2, fail=[1], attempts=3, errors=[planned(2, 1), planned(2, 2)])
    # The message names attempt 1, written for the entry of attempt 2.
    jobs[2] = batch_job(3, fail=[1, 2], errors=[planned(3, 1), planned(3, 1, entry_attempt=2)])
    found = sb.batch_violations(jobs)
    assert kinds(found) == ["batch-mate"] * 3
    assert "'job #2 failed on attempt 1, as its payload asked' on its attempt 1" in found[0][2]


def test_a_result_of_a_batch_mate_or_of_another_attempt_is_caught():
    jobs = clean()
    jobs[0] = batch_job(1, result={"job": 2, "attempt": 1, "batch": 5})
    jobs[1] = batch_job(2, fail=[1], result={"job": 2, "attempt": 1, "batch": 5})
    found = sb.batch_violations(jobs)
    assert kinds(found) == ["batch-mate", "batch-mate"]
    assert "with the result {'job': 2" in found[0][2]


def test_a_success_its_plan_fails_and_a_dead_job_with_attempts_left_are_caught():
    jobs = clean()
    jobs[1] = batch_job(2, fail=[1], attempts=1, errors=[])  # done on attempt 1, planned to fail
    jobs[2] = batch_job(3, state="dead", attempts=1, errors=[])  # dead with two attempts left
    found = sb.batch_violations(jobs)
    assert kinds(found) == ["batch-outcome", "batch-outcome"]
    assert "which its plan [1] fails" in found[0][2]
    assert "dead after 1 of 3 attempts" in found[1][2]


def test_a_success_written_twice_is_caught():
    jobs = clean()
    jobs[0] = batch_job(1, done=2)
    found = sb.batch_violations(jobs)
    assert kinds(found) == ["batch-done-twice"]
    assert "reached done 2x" in found[0][2]
