"""Restarting in place (django_dbqueue/restart.py): the delay between restarts, and the state
the old image hands the new one (no database, no exec)."""

import json
import os

from django_dbqueue import restart


def test_restarts_in_quick_succession_wait_longer_and_longer():
    now = 1000.0
    assert restart.delay([], now) == 0.0
    assert restart.delay([now - 61], now) == 0.0  # outside the window: a first restart
    assert restart.delay([now - 5], now) == 0.5
    assert restart.delay([now - 5, now - 3, now - 1], now) == 2.0
    assert restart.delay([now - 1] * 20, now) == 30.0


def read(monkeypatch, value):
    """What a new image reads from the environment ``value`` (None: not set)."""
    monkeypatch.setattr(restart, "_taken", [])
    if value is None:
        monkeypatch.delenv(restart.ENV, raising=False)
    else:
        monkeypatch.setenv(restart.ENV, value)
    return restart.previous()


def test_the_state_left_for_the_new_image_is_read_once_and_taken_out_of_the_environment(
    monkeypatch,
):
    assert read(monkeypatch, None) is None and restart.worker_id() is None
    state = {"pid": os.getpid(), "worker": "host:1:ab", "times": [1.5]}
    assert read(monkeypatch, json.dumps(state)) == {
        "worker": "host:1:ab",
        "times": [1.5],
        "held": [],
    }
    assert restart.ENV not in os.environ  # a process started from here does not inherit it
    assert restart.worker_id() == "host:1:ab"


def test_a_state_inherited_from_another_process_or_broken_is_ignored(monkeypatch):
    other = {"pid": os.getpid() + 1, "worker": "host:1:ab", "times": [1.5]}
    assert read(monkeypatch, json.dumps(other)) is None
    for broken in ("{", "[]", json.dumps({"worker": "x"}), json.dumps({"pid": os.getpid()})):
        assert read(monkeypatch, broken) is None


RUN = {
    "id": 7,
    "token": 123456789012,
    "type": "serial-hang",
    "name": "serial-hang",
    "queue": "default",
    "attempt": 1,
    "max_attempts": 1,
}


def test_the_runs_the_old_image_held_reach_the_new_one_through_an_inherited_file(monkeypatch):
    """Any number of them (the environment is bounded, the file is not); the file is unlinked
    from the start and its descriptor is closed once read."""
    runs = [
        {**RUN, "outcome": ["failed", {"class": "TimeoutError", "message": "m"}, 0.5, False]},
        {**RUN, "id": 8, "outcome": ["done", '{"ok": 1}']},
    ] + [{**RUN, "id": 100 + n, "outcome": ["spent"]} for n in range(5000)]
    fd = restart._hand_over(runs)
    assert os.get_inheritable(fd)  # it survives the exec
    state = {"pid": os.getpid(), "worker": "host:1:ab", "times": [1.5], "held_fd": fd}
    assert len(json.dumps(state)) < 200  # the environment carries the descriptor only
    assert read(monkeypatch, json.dumps(state))["held"] == runs
    try:
        os.fstat(fd)
    except OSError:
        pass
    else:
        raise AssertionError("the descriptor was left open")
    assert restart._hand_over([]) is None


def test_held_runs_that_cannot_be_read_are_left_to_the_release(monkeypatch, caplog):
    """A broken hand-over loses no job: the new image hands them back as before (logged)."""
    fd = restart._hand_over([{**RUN, "outcome": ["exploded"]}])
    state = {"pid": os.getpid(), "worker": "host:1:ab", "times": [], "held_fd": fd}
    assert read(monkeypatch, json.dumps(state))["held"] == []
    assert "could not be read" in caplog.text
