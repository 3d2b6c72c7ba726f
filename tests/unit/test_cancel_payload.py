"""The cancel notification "cancel:<id>,<id>": its chunks, its parsing, how an older worker
reads it, and how a group listener forwards it to every worker of its group through the pipes."""

import os

import pytest

from django_dbqueue.cancel_notices import CANCEL_CHUNK, cancel_payloads, parse_cancel
from django_dbqueue.notifications import GroupWaker, parse_wakeup, read_pipe_messages


def test_payloads_are_chunked_sorted_and_short():
    ids = list(range(1, 2 * CANCEL_CHUNK + 2))[::-1]
    payloads = cancel_payloads(ids + ids)
    assert len(payloads) == 3
    assert [i for p in payloads for i in parse_cancel(p)] == sorted(ids)
    # Below NOTIFY's 8000 bytes, and below PIPE_BUF so that a group forwards one in one write.
    assert max(len(p) for p in cancel_payloads(range(10**18, 10**18 + 1000))) < 4096
    assert cancel_payloads([]) == []


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("cancel:1,2,30", [1, 2, 30]),
        ("cancel:", []),
        ("cancel:1,x,²,3", [1, 3]),  # junk is skipped, never raised in a listener
        ("3:default", None),
        ("default", None),
    ],
)
def test_parse_cancel(raw, expected):
    assert parse_cancel(raw) == expected


def test_an_older_worker_reads_a_cancel_as_a_queue_it_does_not_serve():
    queue, count = parse_wakeup("cancel:12,13")
    assert (queue, count) == ("cancel:12,13", 1)


def test_pipe_messages_keep_wakeups_and_cancels_apart_across_reads():
    woken, payloads, rest = read_pipe_messages(b"\x01\x02cancel:1,2\x03\x01\x02cancel:3")
    assert (woken, payloads, rest) == (True, ["cancel:1,2"], b"\x02cancel:3")
    woken, payloads, rest = read_pipe_messages(rest + b",4\x03")
    assert (woken, payloads, rest) == (False, ["cancel:3,4"], b"")


def test_a_group_listener_forwards_a_cancel_to_every_worker_even_busy_ones():
    pipes = {slot: os.pipe() for slot in range(3)}
    try:
        free = [0, 0, 0]  # every worker busy: no wake-up would go to any of them
        waker = GroupWaker({slot: w for slot, (_, w) in pipes.items()}, free, ["default"])
        waker.on_notify("5:default")
        waker.on_notify("cancel:7")
        for read_fd, _ in pipes.values():
            assert read_pipe_messages(os.read(read_fd, 4096)) == (False, ["cancel:7"], b"")
    finally:
        for read_fd, write_fd in pipes.values():
            os.close(read_fd)
            os.close(write_fd)
