"""benchmarks/soak_publish.py, the publish/subscribe invariant, fed fabricated calls, events and
jobs: a clean run passes, and each crafted violation (a missing or doubled subscriber job, a
repeated key that made a new event or job, a job that succeeded twice) is caught."""

from __future__ import annotations

from benchmarks import soak_publish as sp

LEDGER, NOTIFY = sp.SUBSCRIBERS


def event(event_id, key=None, jobs=(LEDGER, NOTIFY), subscribers=sp.SUBSCRIBERS):
    return sp.PublishEvent(event_id, key, list(subscribers), sorted(jobs))


def sub_job(job_id, job_type=LEDGER, done=1, returned=1, effects=None):
    if effects is None and job_type == LEDGER:
        effects = 1
    return sp.SubscriberJob(job_id, job_type, done, returned, effects)


def clean():
    """Two publishes of key "k1" (the second repeats it) and one without a key."""
    calls = [("k1", 1, True, [10, 11]), ("k1", 1, False, [10, 11]), (None, 2, True, [12, 13])]
    events = [event(1, "k1"), event(2)]
    jobs = [sub_job(10), sub_job(11, NOTIFY), sub_job(12), sub_job(13, NOTIFY)]
    return calls, events, jobs


def kinds(found):
    return sorted(kind for kind, _key, _text in found)


def test_a_clean_run_passes_and_is_counted():
    stats = sp.PublishStats()
    assert sp.publish_violations(*clean(), stats) == []
    assert (stats.calls, stats.repeats, stats.events, stats.jobs, stats.done) == (3, 1, 2, 4, 4)


def test_a_missing_or_doubled_or_foreign_subscriber_job_is_caught():
    calls, events, jobs = clean()
    events[0] = event(1, "k1", jobs=[LEDGER])  # the notify job is missing
    events[1] = event(2, jobs=[LEDGER, LEDGER, NOTIFY])  # two ledger jobs
    found = sp.publish_violations(calls, events, jobs)
    assert kinds(found) == ["publish-jobs", "publish-jobs"]
    assert "has jobs of ['soak-sub-ledger']" in found[0][2]
    events = [event(1, "k1"), event(2, subscribers=[LEDGER], jobs=[LEDGER])]  # names too few
    assert kinds(sp.publish_violations(calls, events, jobs)) == ["publish-jobs"]


def test_a_repeated_key_that_made_a_new_event_is_caught():
    calls, events, jobs = clean()
    calls[1] = ("k1", 3, True, [14, 15])  # the repeat created event 3
    events.append(event(3, "k1"))
    found = sp.publish_violations(calls, events, jobs)
    assert kinds(found) == ["publish-repeat"]
    assert "2 publishes created 2 events, returned events [1, 3]" in found[0][2]


def test_a_repeat_that_returned_a_new_job_or_a_keyless_publish_not_created_is_caught():
    calls, events, jobs = clean()
    calls[1] = ("k1", 1, False, [10, 11, 99])
    calls[2] = (None, 2, False, [12, 13])
    found = sp.publish_violations(calls, events, jobs)
    assert kinds(found) == ["publish-repeat", "publish-repeat"]
    assert any("a new job" in text for _k, _key, text in found)


def test_a_key_the_database_holds_twice_or_not_at_all_is_caught():
    calls, events, jobs = clean()
    events[0] = event(1, None)  # the event lost its key
    assert kinds(sp.publish_violations(calls, events, jobs)) == ["publish-repeat"]


def test_a_job_that_succeeded_twice_is_caught_and_a_plain_rerun_is_only_counted():
    calls, events, jobs = clean()
    jobs[0] = sub_job(10, effects=2, returned=2)  # the atomic effect committed twice
    jobs[1] = sub_job(11, NOTIFY, done=2, returned=2)  # done twice
    jobs[3] = sub_job(13, NOTIFY, done=1, returned=2)  # returned twice, done once: at-least-once
    stats = sp.PublishStats()
    found = sp.publish_violations(calls, events, jobs, stats)
    assert kinds(found) == ["publish-done-twice", "publish-done-twice"]
    assert sorted(key for _kind, key, _text in found) == [(10,), (11,)]
    assert stats.returned_twice == {LEDGER: 1, NOTIFY: 2}
