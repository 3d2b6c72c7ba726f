"""Notification payloads that anyone who can connect may send (NOTIFY needs no privilege, and a
payload holds up to 8000 bytes): every parser reads a malformed one as no information, at most a
wake-up for a queue nobody serves, and never raises (issue 35, finding C of the second review:
a count of 5000 digits made int() raise out of the worker's loop)."""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from django_dbqueue.cancel_notices import MAX_ID, parse_cancel
from django_dbqueue.notifications import (
    CANCEL_END,
    GroupWaker,
    parse_named,
    parse_wakeup,
    read_pipe_messages,
)
from django_dbqueue.results import _names

PIPE_BUF = 4096

HOSTILE = [
    "9" * 5000 + ":default",
    "9" * 5000,
    "9" * 7990 + ":q",
    "9" * 19 + ":default",  # one digit more than any count
    "1/" + "9" * 5000 + ":default",
    "1/" + ".".join(["9" * 100] * 70) + ":default",
    "9" * 4000 + "/" + "9" * 3990 + ":default",
    "cancel:" + "9" * 5000,
    "cancel:" + "9" * 7993,
    "cancel:" + ",".join(["9" * 30] * 250),
    "cancel:" + str(2**63),  # past a bigint
    "cancel:0",
    "cancel:" + "," * 7993,
    "cancel:",
    "cancel:-5",
    "cancel:+5, 6,7 ,1_000",
    "cancel:٣,²,\uff11",  # Unicode digits: not ids
    "x" * 8000,
    ":" * 8000,
    "/" * 8000,
    "." * 8000,
    "٣:default",  # Arabic-Indic three
    "\uff11\uff12:default",  # full-width digits
    "²:default",
    "-1:default",
    "+1:default",
    " 1:default",
    "1_000:default",
    "1/-1:default",
    "1/٣:default",
    "1/:default",
    "/:",
    ":",
    "",
    "\ufffd" * 2000,
    "\udc80:default",  # a lone surrogate (a decode with surrogateescape)
    "\x01\x02\x03:default",
]


@pytest.mark.parametrize("raw", HOSTILE, ids=lambda raw: repr(raw[:24]) + f"..{len(raw)}")
def test_no_parser_raises_on_a_hostile_payload(raw):
    queue, count = parse_wakeup(raw)
    assert isinstance(queue, str)
    assert 1 <= count < 10**18 or count == 0
    named = parse_named(raw)
    assert named is None or all(0 <= slot < 10**18 for slot in named)
    ids = parse_cancel(raw)
    assert ids is None or all(1 <= job_id <= MAX_ID for job_id in ids)
    _names(raw, 7)


@pytest.mark.parametrize(
    "raw", ["9" * 5000 + ":default", "9" * 19 + ":default", "1/" + "9" * 5000 + ":default"]
)
def test_a_count_or_slot_too_long_is_no_wakeup_for_the_queue(raw):
    # Read as an older sender's bare queue name, which no worker serves.
    assert parse_wakeup(raw) == (raw, 1)
    assert parse_named(raw) is None


def test_a_cancel_keeps_its_real_ids_among_junk():
    junk = "9" * 5000
    assert parse_cancel(f"cancel:{junk},12,-3,0,{2**63},{2**63 - 1},٣") == [12, 2**63 - 1]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=8000) | st.text(alphabet="0123456789:/.,-cancel٣²", max_size=8000))
def test_no_parser_raises_on_any_text(raw):
    parse_wakeup(raw)
    parse_named(raw)
    parse_cancel(raw)
    parse_cancel("cancel:" + raw)
    parse_wakeup("1/" + raw)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=9000))
def test_the_pipe_reader_never_raises(data):
    woken, payloads, rest = read_pipe_messages(data)
    assert isinstance(woken, bool) and isinstance(rest, bytes)
    for payload in payloads:
        parse_cancel(payload)


def test_a_group_listener_survives_hostile_payloads_and_forwards_cancels_whole():
    pipes = {slot: os.pipe() for slot in range(2)}
    try:
        for _, write_fd in pipes.values():
            os.set_blocking(write_fd, False)
        waker = GroupWaker({slot: w for slot, (_, w) in pipes.items()}, [1, 1], ["default"])
        for raw in HOSTILE:
            waker.on_notify(raw)
        # A cancel of 8000 bytes naming ids past 18 digits: forwarded re-written, in messages
        # shorter than PIPE_BUF (written whole or not at all, never interleaved).
        ids = [10**18 + i for i in range(399)]
        big = "cancel:" + ",".join(str(i) for i in ids)
        assert len(big) > PIPE_BUF
        waker.on_notify(big)
        for read_fd, _ in pipes.values():
            data = b""
            os.set_blocking(read_fd, False)
            try:
                while chunk := os.read(read_fd, 65536):
                    data += chunk
            except BlockingIOError:
                pass
            _, payloads, rest = read_pipe_messages(data)
            assert rest == b""
            forwarded = [i for p in payloads for i in parse_cancel(p)]
            assert set(ids) <= set(forwarded)
            frames = data.split(CANCEL_END)
            assert all(len(frame) < PIPE_BUF for frame in frames)
    finally:
        for read_fd, write_fd in pipes.values():
            os.close(read_fd)
            os.close(write_fd)
