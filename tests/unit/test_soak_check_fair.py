"""benchmarks/soak_fair.py, the invariant "fairness never starves a key", fed fabricated claims
and jobs: a key that waits while another key gets jobs in more than two claims is caught; the
rotation's own order, a key whose turn came, and a wait in which the fair worker was killed or
stopped are not."""

from __future__ import annotations

import datetime

from benchmarks import soak_fair as sf

T0 = datetime.datetime(2026, 12, 5, 12, 0, 0, tzinfo=datetime.UTC)
TAGS = ["w3.1"]


def at(seconds):
    return T0 + datetime.timedelta(seconds=seconds)


def claims(*batches):
    """One claim per second from t=1: each a list of the keys of the jobs it took."""
    return [(n, at(n), key) for n, keys in enumerate(batches, 1) for key in keys]


def job(job_id, key, due, end=None):
    return sf.FairJob(job_id, key, at(due), None if end is None else at(end))


def test_a_key_passed_over_while_another_gets_three_claims_is_a_violation():
    found = sf.fair_violations(
        [job(7, "t1", 0.5, end=4.5)],
        claims(["hog"], ["hog"], ["hog"], ["hog", "t1"]),
        TAGS,
    )
    [(kind, key, text)] = found
    assert (kind, key) == ("fair-starve", (7,))
    assert "'hog' got jobs in 3 claims (bound 2)" in text


def test_two_claims_of_another_key_are_the_bound_not_a_violation():
    stats = sf.FairStats()
    found = sf.fair_violations(
        [job(7, "t1", 0.5, end=3.5)], claims(["hog"], ["hog"], ["hog", "t1"]), TAGS, stats=stats
    )
    assert found == [] and stats.worst == 2


def test_a_job_still_pending_is_checked_up_to_the_last_claim():
    found = sf.fair_violations(
        [job(7, "t1", 0.5)], claims(["hog", "a"], ["hog", "b"], ["hog", "c"]), TAGS
    )
    assert [v[0] for v in found] == ["fair-starve"]


def test_the_wait_ends_at_the_keys_turn_whichever_job_of_it_was_taken():
    """A job deep in its own key's backlog waits many claims: its key had its turn in each."""
    many = claims(*[["hog", "t1"] for _ in range(6)])
    assert sf.fair_violations([job(9, "hog", 0.5, end=6.5)], many, TAGS) == []
    # Other keys, each once per rotation while one key waits: no violation either.
    rotation = claims(["a", "b"], ["c", "d"], ["e", "t1"])
    assert sf.fair_violations([job(7, "t1", 0.5, end=3.5)], rotation, TAGS) == []


def test_a_kill_or_a_stop_of_the_fair_worker_in_the_wait_excuses_it():
    starved = claims(["hog"], ["hog"], ["hog"], ["hog", "t1"])
    jobs = [job(7, "t1", 0.5, end=4.5)]
    stats = sf.FairStats()
    killed = sf.fair_violations(jobs, starved, TAGS, deaths={"w3.1": at(2)}, stats=stats)
    assert killed == [] and stats.excused == 1
    stopped = [("stop", "w3.2", at(1.5), at(2.5))]  # a later process of the same slot
    assert sf.fair_violations(jobs, starved, TAGS, faults=stopped) == []
    still = [("stop", "w3.1", at(0.1), None)]  # stopped, not continued yet
    assert sf.fair_violations(jobs, starved, TAGS, faults=still) == []
    # A fault of another worker, or one outside the wait, excuses nothing.
    other = [("kill", "w0.1", at(2), at(2)), ("sigterm", "w3.1", at(0.1), None)]
    assert [v[0] for v in sf.fair_violations(jobs, starved, TAGS, faults=other)] == ["fair-starve"]


def test_the_producer_makes_fair_jobs_only_when_a_worker_serves_the_queue_alone():
    assert sf.is_fair_slot(3, 4) and not sf.is_fair_slot(2, 4) and not sf.is_fair_slot(2, 3)
    assert sf.produce([0.1] * 8, {}, workers=3) == []
    backlog = sf.produce([0.1, 0.5, 0, 0, 0, 0, 0, 0], {}, workers=4)
    assert len(backlog) == 40 and {i["fair_key"] for i in backlog} == {"hog"}
    singles = sf.produce([0.9, 0, 0.123, 0.9, 0, 0, 0, 0], {"ms": 20}, workers=4)
    assert len(singles) == 6 and len({i["fair_key"] for i in singles}) == 6
    assert {i["queue"] for i in backlog + singles} == {"fair"}
