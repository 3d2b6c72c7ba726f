"""Process mode: who may close a handler child's pipe (no database)."""

import multiprocessing
import types

from django_dbqueue.processes import ProcessPool, _Child


class FakeProcess:
    pid = 4242

    def __init__(self):
        self.killed = 0

    def kill(self):
        self.killed += 1

    def join(self, timeout=None):
        pass


def make_child():
    child = _Child.__new__(_Child)  # no real process: only the pipe and the kill matter here
    child.conn, other_end = multiprocessing.Pipe()
    child.process = FakeProcess()
    return child, other_end


def test_the_watchdog_kills_a_timed_out_child_but_leaves_its_pipe_to_the_slot_thread():
    """abandon() runs on the watchdog's thread while the slot's thread owns the pipe. If both
    closed it, the second close could hit the descriptor number the slot's thread had reused
    for its next child's pipe, failing that next job ("the handler process died")."""
    pool = ProcessPool(worker=None, size=1, hung_limit=1)
    child, other_end = make_child()
    entry = types.SimpleNamespace(ctx=types.SimpleNamespace(id=7, type="hang", name="hang"))
    pool._children[id(entry)] = child

    pool.abandon(entry)

    assert child.process.killed == 1
    assert not child.conn.closed, "the watchdog closed a pipe it does not own"
    other_end.send_bytes(b"still open")  # the slot's thread can still read it...
    assert child.conn.recv_bytes() == b"still open"
    child.kill()  # ...and closes it itself
    assert child.conn.closed
    assert child.process.killed == 2
    other_end.close()


def test_abandon_of_a_run_without_a_child_does_nothing():
    pool = ProcessPool(worker=None, size=1, hung_limit=1)
    entry = types.SimpleNamespace(ctx=types.SimpleNamespace(id=8, type="hang", name="hang"))
    pool.abandon(entry)  # the slot's thread had not registered its child yet: nothing to kill
