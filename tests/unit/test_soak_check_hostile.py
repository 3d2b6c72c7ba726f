"""benchmarks/soak_hostile.py, the hostile actors' invariants, fed fabricated records: a clean run
passes, and each crafted violation is caught: a worker that exited with no fault sent, a door that
took what Python cannot read or refused what docs/sql.md says it takes, a poisoned job that ran or
ended other than dead of UnreadableJob, a job dead of another's poison or of nothing, an attempt
no run began that nothing explains, a lease taken back from a worker the soak never faulted."""

from __future__ import annotations

import datetime

from benchmarks import soak_hostile as sh

T0 = datetime.datetime(2026, 12, 6, 8, 0, tzinfo=datetime.UTC)


def at(seconds):
    return T0 + datetime.timedelta(seconds=seconds)


def kinds(found):
    return sorted(kind for kind, _key, _text in found)


UNREADABLE = "django_dbqueue.exceptions.UnreadableJob"


# -- worker-exit ---------------------------------------------------------------------------------


FAULTS = [
    ["kill", "w0.1", at(10), at(10)],
    ["sigterm", "w1.1", at(20), None],
    ["stop", "w2.1", at(30), at(37)],
    ["terminate", "w3.1", at(40), at(40)],
]


def test_exits_the_soak_caused_pass():
    exits = [("w0.1", -9, at(10.2)), ("w1.1", 0, at(22))]
    assert sh.exit_violations(exits, FAULTS) == []


def test_an_exit_no_kill_or_sigterm_explains_is_caught():
    exits = [
        ("w2.1", 1, at(31)),  # stopped, never killed: it must not exit
        ("w3.1", 1, at(41)),  # its sessions terminated: it must reconnect, not exit
        ("w0.1", 1, at(5)),  # before the kill the soak sent it
        ("w0.2", 1, at(50)),  # the next process of the slot: never faulted
    ]
    found = sh.exit_violations(exits, FAULTS)
    assert kinds(found) == ["worker-exit"] * 4
    assert "worker w2.1 exited with code 1" in found[0][2]


# -- doors ---------------------------------------------------------------------------------------


def test_a_door_that_refuses_and_takes_as_documented_passes():
    calls = [
        sh.DoorCall("digits-5000", "refused", "refused", None, "22023: ..."),
        sh.DoorCall("deep-100", "taken", "taken", 7, ""),
    ]
    stats = sh.HostileStats()
    assert sh.door_violations(calls, {7: sh._deep(100)}, stats) == []
    assert stats.doors == {"digits-5000 refused": 1, "deep-100 taken": 1}


def test_a_door_that_takes_an_unreadable_payload_or_refuses_a_readable_one_is_caught():
    calls = [
        sh.DoorCall("deep-1500", "refused", "taken", 8, ""),
        sh.DoorCall("e400", "taken", "refused", None, "22023: ..."),
        sh.DoorCall("digits-5000", "refused", "error", None, "54001: stack depth limit exceeded"),
    ]
    found = sh.door_violations(calls, {8: sh._deep(1500)})
    assert kinds(found) == ["door-accepted", "door-error", "door-refused", "door-unreadable"]
    unreadable = next(text for kind, _k, text in found if kind == "door-unreadable")
    assert "nested 1500 levels deep" in unreadable


def test_readable_tells_what_python_cannot_read():
    assert sh.readable('{"n": ' + "9" * 4300 + "}") is None
    assert "5000 digits" in sh.readable('{"n": ' + "9" * 5000 + "}")
    assert "inf" in sh.readable('{"x": 1' + "0" * 400 + ".5}")


# -- poison --------------------------------------------------------------------------------------

POISONED = {
    1: sh.Poisoned(1, "deep-1500", at(1), 0),
    2: sh.Poisoned(2, "digits-5000", at(2), 0),
    3: sh.Poisoned(3, "float-400", at(3), 0),
}


def poison_row(job, state="dead", attempts=1, cls=UNREADABLE, message="payload: ...", by=None,
               runs=None, expired=0):  # fmt: skip
    return (job, state, attempts, cls, message, by, runs, expired)


def test_poisoned_jobs_dead_of_unreadable_job_pass():
    rows = [
        poison_row(1),
        poison_row(2, state="cancelled", attempts=0, cls=None, message=None, by="soak"),
        poison_row(3, state="pending", attempts=0, cls=None, message=None),  # not claimed yet
    ]
    stats = sh.HostileStats()
    assert sh.poison_violations(POISONED, rows, stats=stats) == []
    assert stats.poisoned == {"dead": 1, "cancelled": 1, "pending": 1}


def test_a_poisoned_job_that_ran_or_ended_otherwise_is_caught():
    rows = [
        poison_row(1, state="done", runs=[41]),  # a handler ran it after the poison
        poison_row(2, cls="RuntimeError", message="boom"),  # dead, but not of its payload
        poison_row(3, attempts=3),  # charged three claims
    ]
    found = sh.poison_violations(POISONED, rows)
    assert kinds(found) == ["poison-end", "poison-end", "poison-end", "poison-ran"]
    assert any("RuntimeError" in text for _kind, _key, text in found)


def test_a_claim_charged_by_a_lease_that_expired_after_the_poison_is_excused():
    # Claimed, then its worker killed before it read the row: the sweep counts that attempt,
    # then the next claim finds the poison (soak seed 3536, job 16322).
    assert sh.poison_violations(POISONED, [poison_row(1, attempts=2, expired=1)]) == []
    found = sh.poison_violations(POISONED, [poison_row(1, attempts=3, expired=1)])
    assert kinds(found) == ["poison-end"]


def test_a_poisoned_job_left_pending_is_caught_after_the_drain_only():
    rows = [poison_row(3, state="pending", attempts=0, cls=None, message=None)]
    assert sh.poison_violations(POISONED, rows) == []
    assert kinds(sh.poison_violations(POISONED, rows, final=True)) == ["poison-end"]


# -- dead-unowned --------------------------------------------------------------------------------


def test_dead_jobs_of_their_own_failures_pass_and_others_are_caught():
    rows = [
        (1, 1, "payload: nested 1500 levels deep"),  # poisoned by the soak: its own
        (5, 0, None),  # dead with an empty history
        (6, 2, "payload: an integer of 5000 digits"),  # another job's poison
    ]
    found = sh.dead_violations(rows, POISONED)
    assert kinds(found) == ["dead-unowned", "dead-unowned"]
    assert [key for _kind, key, _text in found] == [(5,), (6,)]
    assert sh.dead_violations(rows[:1], POISONED) == []


class _ActorDuringTheQuery:
    """A connection whose DEAD query meets a job the actor poisoned (noted, written, and
    fatal) while the checker was between its reads: the actor's note lands during the query."""

    def __init__(self, poisoned):
        self.poisoned = poisoned

    def execute(self, sql, params=None):
        assert sql == sh.DEAD
        self.poisoned[7] = sh.Poisoned(7, "float-400", at(50), 0)
        self.rows = [(7, 1, "payload: a number of 403 characters, beyond a float's range")]
        return self

    def fetchall(self):
        return self.rows


def test_a_poison_noted_while_the_checker_reads_is_not_unowned():
    poisoned = dict(POISONED)
    assert sh.dead_found(_ActorDuringTheQuery(poisoned), poisoned) == []
    # What the checker did before (the ids copied first, then the query) finds it unowned.
    before = dict(POISONED)
    rows = _ActorDuringTheQuery(dict(POISONED)).execute(sh.DEAD).fetchall()
    assert kinds(sh.dead_violations(rows, before)) == ["dead-unowned"]


# -- attempts ------------------------------------------------------------------------------------

PIDS = {100: ["w0.1"], 200: ["w1.1", "w1.2"], 300: ["w2.1"]}


def unrun(job, state, attempts, n, cls=None, worker=None, when=None):
    return (job, state, attempts, n, cls, worker, when and when.isoformat())


def test_attempts_no_run_began_that_something_explains_pass():
    rows = [
        unrun(1, "running", 2, 2),  # its run is on its way
        unrun(2, "cancelled", 1, 1),  # cancelled before its handler started
        unrun(3, "dead", 1, 1, UNREADABLE),  # a poison
        unrun(4, "pending", 2, 1, "LeaseExpired", "host:100:ab12cd", at(11)),  # after the kill
        unrun(5, "pending", 1, 1, "LeaseExpired", "host:300:ab12cd", at(33)),  # stopped
    ]
    stats = sh.HostileStats()
    assert sh.attempt_violations(rows, FAULTS, PIDS, stats) == []
    assert stats.unrun == {
        "last attempt, running": 1,
        "last attempt, cancelled": 1,
        "UnreadableJob": 1,
        "LeaseExpired after a fault": 2,
    }


def test_an_attempt_nothing_explains_is_caught():
    rows = [
        unrun(1, "pending", 1, 1),  # charged, never run, no entry
        unrun(2, "running", 3, 2),  # not its last attempt
        unrun(3, "done", 1, 1),
        # Leases taken back from w1.x before its SIGTERM, and from w0.1 before its kill.
        unrun(4, "pending", 1, 1, "LeaseExpired", "host:200:ab12cd", at(15)),
        unrun(5, "pending", 1, 1, "LeaseExpired", "host:100:ab12cd", at(5)),
        unrun(6, "pending", 1, 1, "LeaseExpired", "host:999:ab12cd", at(50)),  # not the soak's
    ]
    found = sh.attempt_violations(rows, FAULTS, PIDS)
    assert kinds(found) == ["attempt-charged"] * 3 + ["attempt-swept"] * 3
    assert "w1.1, w1.2" in next(text for _k, key, text in found if key == (4, 1))


# -- retype-end ----------------------------------------------------------------------------------

RETYPED = {7: sh.Poisoned(7, "type-unknown", at(1), 0), 8: sh.Poisoned(8, "type-unknown", at(2), 0)}


def test_a_retyped_job_that_runs_once_its_type_is_back_passes():
    rows = [(7, "done", 1, sh.POISON_TYPE), (8, "cancelled", 0, sh.POISON_TYPE)]
    assert sh.retype_violations(RETYPED, rows, final=True) == []
    # Before the drain, still pending with its unknown type: not yet a violation.
    assert sh.retype_violations(RETYPED, [(7, "pending", 0, sh.UNKNOWN_TYPE)]) == []


def test_a_retyped_job_dead_or_left_is_caught():
    rows = [(7, "dead", 3, sh.POISON_TYPE), (8, "pending", 0, sh.UNKNOWN_TYPE)]
    assert kinds(sh.retype_violations(RETYPED, rows)) == ["retype-end"]
    found = sh.retype_violations(RETYPED, rows, final=True)
    assert kinds(found) == ["retype-end", "retype-end"]
    assert "still pending after the drain" in found[1][2]


# -- stalls (benchmarks/soak_check.py) -------------------------------------------------------------


def test_a_lease_taken_within_or_just_after_a_stall_of_the_whole_soak_is_excused():
    from benchmarks import soak_check as sc

    stalls = [(at(10), at(16.5))]
    assert sc.stalled(stalls, at(16.515))  # the sweep right after the stall
    assert sc.stalled(stalls, at(12))
    assert not sc.stalled(stalls, at(9.9))  # before it
    assert not sc.stalled(stalls, at(19))  # the heartbeats had resumed long before
    assert not sc.stalled([], at(12))
