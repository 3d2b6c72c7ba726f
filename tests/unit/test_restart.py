"""Restarting in place (django_dbqueue/restart.py): the delay between restarts, and the state
the old image hands the new one (no database, no exec)."""

import json

from django_dbqueue import restart


def test_restarts_in_quick_succession_wait_longer_and_longer():
    now = 1000.0
    assert restart.delay([], now) == 0.0
    assert restart.delay([now - 61], now) == 0.0  # outside the window: a first restart
    assert restart.delay([now - 5], now) == 0.5
    assert restart.delay([now - 5, now - 3, now - 1], now) == 2.0
    assert restart.delay([now - 1] * 20, now) == 30.0


def test_the_state_left_for_the_new_image_is_read_back_or_ignored_when_broken(monkeypatch):
    monkeypatch.delenv(restart.ENV, raising=False)
    assert restart.previous() is None and restart.worker_id() is None
    monkeypatch.setenv(restart.ENV, json.dumps({"worker": "host:1:ab", "times": [1.5]}))
    assert restart.previous() == {"worker": "host:1:ab", "times": [1.5]}
    assert restart.worker_id() == "host:1:ab"
    for broken in ("{", "[]", json.dumps({"worker": "x"}), json.dumps({"times": "x"})):
        monkeypatch.setenv(restart.ENV, broken)
        assert restart.previous() is None
