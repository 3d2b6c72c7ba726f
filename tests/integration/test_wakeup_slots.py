"""Wake-ups that name their workers (waiters.py, migration 0014), against the real server: the
slots a waiting worker takes and gives back, the payload the sender's statement makes from them,
and in-process workers that leave a wake-up to the workers it names, or to a worker with a free
thread."""

import concurrent.futures
import datetime
import threading
from importlib import import_module

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_dbqueue import enqueue, enqueue_many, waiters
from django_dbqueue.connections import connection_params
from django_dbqueue.store import wakeups as sql
from tests.utils import Listener, scalar, wait_until, wakeup_slots, wakeup_waiters

pytestmark = pytest.mark.django_db(transaction=True)

GAP = import_module("django_dbqueue.migrations.0014_wakeup_slots").GAP  # free in a row: it stops


def direct():
    return psycopg.connect(**connection_params("default"), autocommit=True)


def take(conn, queues, channel="dbqueue", listened=None):
    """``{queue: slot}`` taken on ``conn`` (sql.TAKE_SLOTS, as store.wakeups.take_slots runs it)."""
    params = {"channel": channel, "queues": queues, "listened": listened or [None] * len(queues)}
    slots = conn.execute(sql.TAKE_SLOTS, params).fetchone()[0]
    return dict(zip(queues, slots, strict=True))


def named(payload, channel="dbqueue"):
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT dbqueue_wakeup_payload(%s, %s, %s)", [channel, payload, sql.WAKEUP_SLOTS]
        )
        return cursor.fetchone()[0]


def give(conn, slots, channel="dbqueue"):
    queues = list(slots)
    conn.execute(
        sql.GIVE_SLOTS, {"channel": channel, "queues": queues, "slots": [slots[q] for q in queues]}
    )


def held_by(conns, n, queue="default"):
    """Each of the first ``n`` of ``conns`` takes a slot of ``queue``, in order: slots 0..n-1."""
    for i, conn in enumerate(conns[:n]):
        assert take(conn, [queue]) == {queue: i}


def test_waiters_take_the_lowest_free_slots_and_lose_them_with_their_connection():
    a, b, c = direct(), direct(), direct()
    try:
        assert take(a, ["default", "emails"]) == {"default": 0, "emails": 0}
        assert take(b, ["default"]) == {"default": 1}
        assert wakeup_slots() == {0: a.info.backend_pid, 1: b.info.backend_pid}
        assert wakeup_slots("emails") == {0: a.info.backend_pid}
        a.execute(sql.STOP_WAITING)  # a full claim: it stops waiting, its slots go
        assert wakeup_slots() == {1: b.info.backend_pid}
        assert take(c, ["default"]) == {"default": 0}, "the lowest free one"
        c.close()
        wait_until(lambda: wakeup_slots() == {1: b.info.backend_pid}, message="c's slot gone")
        # Another channel's slots are its own: a project sharing the database and the queue
        # name holds none of ours.
        assert take(a, ["default"], channel="other") == {"default": 0}
        assert wakeup_slots() == {1: b.info.backend_pid}
        assert wakeup_slots(channel="other") == {0: a.info.backend_pid}
    finally:
        for conn in (a, b, c):
            conn.close()


def test_a_worker_gives_back_only_its_slots():
    a, b = direct(), direct()
    try:
        assert take(a, ["default", "emails"]) == {"default": 0, "emails": 0}
        assert waiters.hold(a, ["default"])  # WAITING too, as a waiting worker holds it
        assert take(b, ["default"]) == {"default": 1}
        give(a, {"default": 0, "emails": 0})  # its last free thread took a job
        assert wakeup_slots() == {1: b.info.backend_pid}
        assert wakeup_slots("emails") == {}
        assert wakeup_waiters() == {a.info.backend_pid}, "it still waits: it hears wake-ups"
        assert take(a, ["default"]) == {"default": 0}, "a thread freed: the lowest free again"
    finally:
        a.close()
        b.close()


def test_every_slot_taken_leaves_a_waiter_without_one():
    conns = [direct() for _ in range(4)]
    try:
        got = [
            conn.execute(
                "SELECT dbqueue_take_slots('dbqueue', ARRAY['default'], 3, ARRAY[NULL]::int[])"
            ).fetchone()[0]
            for conn in conns
        ]
        assert got == [[0], [1], [2], [None]]
    finally:
        for conn in conns:
            conn.close()


def test_taking_a_slot_shortens_the_session_s_tcp_keepalives():
    conn = direct()
    try:
        if conn.execute("SELECT inet_client_addr()").fetchone()[0] is None:
            pytest.skip("connected by a Unix socket, where TCP keepalives do not apply")
        conn.execute("SET tcp_keepalives_idle = 7200")
        conn.execute("SET tcp_keepalives_count = 2")  # already shorter: left alone
        conn.execute("SET tcp_user_timeout = 0")  # the system's: about 15 minutes of retries
        take(conn, ["default"])
        got = conn.execute(
            "SELECT current_setting('tcp_keepalives_idle'), "
            "current_setting('tcp_keepalives_interval')::int, "
            "current_setting('tcp_keepalives_count'), current_setting('tcp_user_timeout')"
        ).fetchone()
        assert got[0] == "30" and got[1] <= 10 and got[2] == "2" and got[3] == "60000", got
    finally:
        conn.close()


def slots_named(payload):
    return [int(slot) for slot in payload.split(":")[0].split("/")[1].split(".")]


def test_the_payload_names_held_slots_at_random_one_more_than_its_jobs():
    conns = [direct() for _ in range(6)]
    try:
        held_by(conns, 6)
        ones = [named("1:default") for _ in range(60)]
        assert all(p.startswith("1/") and p.endswith(":default") for p in ones), ones
        pairs = {tuple(slots_named(p)) for p in ones}
        assert all(len(set(pair)) == 2 and set(pair) <= set(range(6)) for pair in pairs), pairs
        assert all(list(pair) == sorted(pair) for pair in pairs), "listed in order"
        # 60 draws of 2 of 6 (15 pairs): all of them one pair, or slot 0 in all, never happens
        # unless the pick is not random.
        assert len(pairs) > 3 and not all(0 in pair for pair in pairs), pairs
        twos = [slots_named(named("2:default")) for _ in range(20)]
        assert all(len(set(three)) == 3 and set(three) <= set(range(6)) for three in twos), twos
        assert named("5:default") == "5/0.1.2.3.4.5:default", "as many as it can: every one"
        assert named("6:default") == "6:default", "fewer held than its jobs and one: nobody"
        assert named("1:emails") == "1:emails", "another queue's slots"
        assert named("1:default", channel="other") == "1:default", "another channel's"
        # What is not a count of jobs, or counts more jobs than there are slots, comes back as
        # it was.
        for payload in ("default", "cancel:1,2", "x:default", "1", "1/2:default", "999:default"):
            assert named(payload) == payload
        # The probe lets go of the free slots it tried: nothing is left held by this session.
        assert wakeup_slots() == {s: conns[s].info.backend_pid for s in range(6)}
    finally:
        for conn in conns:
            conn.close()


def test_the_payload_names_nobody_when_it_finds_too_few():
    conns = [direct() for _ in range(19)]
    try:
        assert named("1:default") == "1:default", "no slot held: nobody named, everyone acts"
        held_by(conns, 1)
        assert named("1:default") == "1:default", "one held, two wanted"
        held_by(conns, 19)
        for conn in conns[1:17]:
            conn.execute(sql.STOP_WAITING)  # slots 1..16 free; 0, 17 and 18 held
        assert named("1:default") == "1:default", "sixteen free in a row: it stopped at one"
        take(conns[1], ["default"])  # slot 1 again: 0, 1, 17, 18 held, 2..16 free
        assert set(slots_named(named("1:default"))) <= {0, 1, 17, 18}
    finally:
        for conn in conns:
            conn.close()


def test_concurrent_senders_never_name_each_other_s_probes():
    # Each sender tries the free slots as it looks for held ones. Were a try to take a slot
    # exclusively (as a worker does), a sender looking at that instant would count it held and
    # could name it: a wake-up for nobody. Four senders at once, 1,500 wake-ups each, with slots
    # 0 and 1 held: every one names exactly those two (an exclusive probe named others in about
    # 2% of the calls here).
    holders = [direct(), direct()]
    senders = [direct() for _ in range(4)]
    try:
        held_by(holders, 2)
        statement = "SELECT dbqueue_wakeup_payload(%s, %s, %s)"
        params = ["dbqueue", "1:default", sql.WAKEUP_SLOTS]

        def send(conn):
            return [conn.execute(statement, params).fetchone()[0] for _ in range(1500)]

        with concurrent.futures.ThreadPoolExecutor(len(senders)) as pool:
            payloads = [p for sent in pool.map(send, senders) for p in sent]
        assert len(payloads) == 6000
        wrong = [p for p in payloads if p != "1/0.1:default"]
        assert not wrong, f"{len(wrong)} named slots nobody held, e.g. {wrong[:5]}"
        assert wakeup_slots() == {0: holders[0].info.backend_pid, 1: holders[1].info.backend_pid}
    finally:
        for conn in holders + senders:
            conn.close()


def test_a_worker_taking_a_slot_while_senders_probe_stays_in_their_sight():
    # Each sender lets go of a probed slot at once, so a worker taking a slot meanwhile is
    # pushed up by a slot per sender at most. Were the probes held until the sender's
    # transaction ends (through its notification's commit), the worker would land past all of
    # them, beyond the sixteen free slots after which every sender stops looking: a waiter
    # never named. Slots 0 and 1 held, four senders at once, a fifth connection taking and
    # giving a slot 300 times: every slot it takes is one a sender looks at (2..17).
    holders = [direct(), direct()]
    senders = [direct() for _ in range(4)]
    taker = direct()
    try:
        held_by(holders, 2)
        statement = "SELECT dbqueue_wake(%s, %s, %s)"
        params = ["dbqueue", "1:default", sql.WAKEUP_SLOTS]
        done = threading.Event()

        def send(conn):
            while not done.is_set():
                conn.execute(statement, params)

        def takes():
            slots = []
            for _ in range(300):
                slots.append(take(taker, ["default"])["default"])
                give(taker, {"default": slots[-1]})
            return slots

        with concurrent.futures.ThreadPoolExecutor(len(senders) + 1) as pool:
            sending = [pool.submit(send, conn) for conn in senders]
            try:
                taken = pool.submit(takes).result(timeout=120)
            finally:
                done.set()
            for future in sending:
                future.result()
        assert set(taken) <= set(range(2, 2 + GAP)), sorted(set(taken))
    finally:
        for conn in holders + senders + [taker]:
            conn.close()


def slot_channel(slot, queue="default", channel="dbqueue"):
    return scalar("SELECT dbqueue_slot_channel(%s, %s, %s)", [channel, queue, slot])


def listening(conn):
    return {row[0] for row in conn.execute("SELECT pg_listening_channels()").fetchall()}


def test_a_waiter_listens_on_its_slot_s_channel_and_moves_when_its_slot_does():
    a, b = direct(), direct()
    try:
        assert take(a, ["default", "emails"]) == {"default": 0, "emails": 0}
        assert listening(a) == {slot_channel(0), slot_channel(0, "emails")}
        assert slot_channel(0) != slot_channel(1) != slot_channel(0, channel="other")
        give(a, {"default": 0, "emails": 0})
        assert listening(a) == {slot_channel(0), slot_channel(0, "emails")}, "until it takes one"
        assert take(b, ["default"]) == {"default": 0}
        assert take(a, ["default"], listened=[0]) == {"default": 1}
        assert slot_channel(0) not in listening(a) and slot_channel(1) in listening(a)
        assert take(a, ["emails"], listened=[0]) == {"emails": 0}  # the same slot: no change
        assert slot_channel(0, "emails") in listening(a)
    finally:
        a.close()
        b.close()


@pytest.fixture
def two_waiting():
    """Two connections holding slots 0 and 1 and a listener that says it waits (so that
    enqueues wake); yields ``(main, slot 0)``: plain listeners of the main channel and of slot
    0's channel."""
    main = Listener(waits=False)
    slot0 = Listener(waits=False, slots=[0], main=False)
    holders = [direct() for _ in range(2)]
    waiting = None
    try:
        held_by(holders, 2)
        waiting = Listener()
        yield main, slot0
    finally:
        for conn in [main, slot0, waiting, *holders]:
            if conn is not None:
                conn.close()


def test_an_enqueue_wakes_the_named_workers_on_their_own_channels(slow_poll_settings, two_waiting):
    main, slot0 = two_waiting
    enqueue("noop")
    assert slot0.until_jobs(1) == ["1/0.1:default"]
    assert main.collect(0.2) == [], "the main channel, and the workers of no slot, hear nothing"


def test_wakeup_if_waiting_false_names_nobody(slow_poll_settings, two_waiting):
    main, slot0 = two_waiting
    slow_poll_settings.DBQUEUE = {**slow_poll_settings.DBQUEUE, "WAKEUP_IF_WAITING": False}
    enqueue("noop")
    assert main.until_jobs(1) == ["1:default"], "the payload earlier releases read"
    assert slot0.collect(0.1) == []


def test_a_wake_up_in_a_transaction_committed_by_hand_names_nobody(slow_poll_settings, two_waiting):
    main, _ = two_waiting
    transaction.set_autocommit(False)
    try:
        enqueue("noop")
        transaction.commit()
    finally:
        transaction.set_autocommit(True)
    assert main.until_jobs(1) == ["1:default"]


def test_without_migration_0014_a_wake_up_fails_loudly_and_the_enqueue_commits(
    slow_poll_settings, two_waiting, caplog
):
    # The app's migrations are required: no fallback that sends the wake-up another way.
    rename = "ALTER FUNCTION {}(text, text, int) RENAME TO {}"
    with connection.cursor() as cursor:
        cursor.execute(rename.format("dbqueue_wake", "dbqueue_wake_x"))
    try:
        with caplog.at_level("WARNING", logger="django_dbqueue.wakeup"):
            job = enqueue("noop")  # after its commit, in a wake-up of its own
        assert "dbqueue_wake" in caplog.text and "could not wake the workers" in caplog.text
        assert job.created
    finally:
        with connection.cursor() as cursor:
            cursor.execute(rename.format("dbqueue_wake_x", "dbqueue_wake"))


# In-process workers ---------------------------------------------------------------------------


@pytest.fixture
def slow_poll_settings(settings, fast_settings):
    settings.DBQUEUE = {**settings.DBQUEUE, "POLL_INTERVAL": 3600.0}
    return settings


def state(job_id):
    return scalar("SELECT state FROM dbqueue_job WHERE id = %s", [job_id])


def done(job_id):
    return state(job_id) == "done"


def pid_of(worker):
    conn = worker.session.conn  # None until the worker connected
    return None if conn is None else conn.info.backend_pid


def test_one_job_sends_only_the_named_workers_into_a_claim(slow_poll_settings, start_worker):
    workers = [start_worker(queues=["default"], concurrency=1) for _ in range(4)]
    wait_until(
        lambda: len(wakeup_slots()) == 4 and all(w.waiting.settled for w in workers),
        message="four idle workers waiting, each with a slot",
    )
    before = wait_until(lambda: _quiet(workers), message="the start-up claims done")
    jobs = 20
    for _ in range(jobs):
        job = enqueue("noop")
        wait_until(lambda job=job: done(job.id), timeout=5, message="the job, woken")
        wait_until(lambda: len(wakeup_slots()) == 4, message="all four waiting again")
    for worker in workers:
        worker.stop()
    for worker in workers:
        worker.thread.join(15)
    claims = sum(w.claims for w in workers) - before
    # Each job names two of the four (its count plus one): about 2 claims per job, where every
    # waiting worker claimed on every wake-up before (4 per job). The slack covers a start-up
    # claim counted late and a worker claiming once more as it started waiting again.
    assert claims <= 2 * jobs + 8, (claims, [w.claims for w in workers])


def _quiet(workers):
    """The workers' claim count, once every one is settled waiting and none is due to claim."""
    if all(w.waiting.settled and not w._claim_next for w in workers):
        return sum(w.claims for w in workers)
    return None


def test_a_worker_holding_no_slot_acts_on_the_wake_ups_naming_nobody(
    slow_poll_settings, start_worker
):
    hog = direct()  # every slot held by one connection that never claims
    try:
        hog.execute(
            "SELECT count(pg_advisory_lock(hashtextextended('dbqueue:default', s))::text) "
            "FROM generate_series(0, %s - 1) AS s",
            [sql.WAKEUP_SLOTS],
        )
        assert len(wakeup_slots()) == sql.WAKEUP_SLOTS
        worker = start_worker(queues=["default"], concurrency=1)
        wait_until(
            lambda: worker.waiting.slots == {"default": None}, message="the worker, slotless"
        )
        # One wake-up for more jobs than there are slots names nobody: the main channel.
        jobs = enqueue_many([("noop", {})] * sql.WAKEUP_SLOTS)
        ids = [job.id for job in jobs]
        wait_until(
            lambda: (
                scalar(
                    "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'done'", [ids]
                )
                == len(ids)
            ),
            timeout=30,
            message="every job done",
        )
    finally:
        hog.close()


def test_a_worker_acts_on_a_wake_up_naming_it_or_nobody(slow_poll_settings, start_worker):
    worker = start_worker(queues=["default", "emails"], concurrency=1)
    wait_until(lambda: worker.waiting.slots is not None, message="the worker with its slots")
    slot = worker.waiting.slots["default"]
    assert slot is not None
    acts = worker.waiting.acts_on
    assert acts("default", frozenset({slot}), free_thread=True) is True
    assert acts("default", frozenset({slot, slot + 1}), free_thread=True) is True
    assert acts("default", frozenset({slot + 1}), free_thread=True) is False
    assert acts("default", None, free_thread=True) is True, "naming nobody"
    # Every thread busy: nothing now; later, when the wake-up was for it.
    assert acts("default", frozenset({slot}), free_thread=False) is None
    assert acts("default", None, free_thread=False) is None
    assert acts("default", frozenset({slot + 1}), free_thread=False) is False


def test_a_busy_worker_gives_its_slot_back_and_takes_one_when_a_thread_frees(
    slow_poll_settings, start_worker, tmp_path
):
    flag = tmp_path / "go"
    worker = start_worker(queues=["default"], concurrency=1)
    wait_until(lambda: wakeup_slots() == {0: pid_of(worker)}, message="its slot")
    slow = enqueue("slow-record", {"until_file": str(flag), "seconds": 30})
    wait_until(lambda: state(slow.id) == "running", timeout=5, message="the slow job running")
    wait_until(lambda: wakeup_slots() == {}, message="its slot given back: no thread free")
    assert wakeup_waiters() == {pid_of(worker)}, "it still waits for wake-ups"
    flag.touch()
    wait_until(lambda: done(slow.id), timeout=10, message="the slow job done")
    wait_until(lambda: wakeup_slots() == {0: pid_of(worker)}, message="its slot taken again")


def test_a_wake_up_for_a_busy_worker_is_claimed_when_its_thread_frees(
    slow_poll_settings, start_worker, tmp_path
):
    flag = tmp_path / "go"
    worker = start_worker(queues=["default"], concurrency=1)
    wait_until(lambda: worker.waiting.slots is not None, message="the worker waiting")
    slow = enqueue("slow-record", {"until_file": str(flag), "seconds": 30})
    wait_until(lambda: state(slow.id) == "running", timeout=5, message="the slow job running")
    # The claim's transaction commits before the worker books it: the job reads running
    # while the count may still say nothing was taken. Wait for the book, then count the
    # jobs claimed (one attribute, written once per claim; the loop may still run the
    # follow-up claim of its full first batch, which finds nothing): none may be added.
    wait_until(lambda: worker.claimed_total == 1, timeout=5, message="the slow job booked")
    job = enqueue("noop")  # nobody holds a slot: names nobody; the worker's thread is busy
    wait_until(lambda: worker._missed, timeout=5, message="the wake-up kept for later")
    assert state(job.id) == "pending", "not claimed into the busy worker's buffer"
    assert worker.claimed_total == 1, "no claim took a job while busy"
    flag.touch()
    wait_until(lambda: done(job.id), timeout=5, message="claimed once the thread freed")


def test_a_job_named_for_busy_workers_starts_on_an_idle_one_at_once(
    slow_poll_settings, start_worker, tmp_path
):
    flag = tmp_path / "go"
    workers = []
    for i in range(4):
        workers.append(start_worker(queues=["default"], concurrency=1))
        wait_until(lambda i=i: len(wakeup_slots()) == i + 1, message=f"worker {i}'s slot")
    try:
        # Two slow jobs, one after the other: each takes the last free thread of a worker,
        # which gives its slot back. (Before, the lowest two slots stayed held by workers whose
        # threads were busy, and every job was named for them.)
        for _ in range(2):
            slow = enqueue("slow-record", {"until_file": str(flag), "seconds": 30})
            wait_until(lambda slow=slow: state(slow.id) == "running", message="a slow job")
        with connection.cursor() as cursor:
            cursor.execute("SELECT worker_id FROM dbqueue_job WHERE state = 'running'")
            running = {row[0] for row in cursor.fetchall()}
        assert len(running) == 2, running
        free = [w for w in workers if w.worker_id not in running]
        wait_until(
            lambda: set(wakeup_slots().values()) == {pid_of(w) for w in free},
            message="only the idle workers hold slots",
        )
        for _ in range(5):
            job = enqueue("noop")  # names both idle workers
            wait_until(lambda job=job: done(job.id), timeout=5, message="the job, at once")
            worker_id = scalar("SELECT worker_id FROM dbqueue_job WHERE id = %s", [job.id])
            assert worker_id in {w.worker_id for w in free}
            wait_until(lambda: len(wakeup_slots()) == 2, message="the idle ones waiting again")
    finally:
        flag.touch()


def test_a_wake_up_naming_the_slot_just_given_back_is_claimed_when_the_thread_frees(
    slow_poll_settings, start_worker, tmp_path, monkeypatch
):
    # The sender looked just before the worker gave its slot back; its wake-up arrives after.
    # (The grace is widened so that this slow machine's timing cannot decide the test.)
    monkeypatch.setattr(waiters, "GIVEN_GRACE", 60.0)
    flag = tmp_path / "go"
    worker = start_worker(queues=["default"], concurrency=1)
    wait_until(lambda: wakeup_slots() == {0: pid_of(worker)}, message="its slot")
    spare = direct()  # holds slot 1 and never claims: a frozen spare
    try:
        assert take(spare, ["default"]) == {"default": 1}
        slow = enqueue("slow-record", {"until_file": str(flag), "seconds": 30})
        wait_until(lambda: state(slow.id) == "running", timeout=5, message="the slow job")
        wait_until(lambda: wakeup_slots() == {1: spare.info.backend_pid}, message="slot given")
        later = timezone.now() + datetime.timedelta(hours=1)  # no wake-up of its own
        job = enqueue("noop", run_after=later)
        with connection.cursor() as cursor:
            cursor.execute("UPDATE dbqueue_job SET run_after = now() WHERE id = %s", [job.id])
        # On the channel of slot 0, which the worker still LISTENs on.
        spare.execute("SELECT pg_notify(%s, '1/0.1:default')", [slot_channel(0)])
        wait_until(lambda: worker._missed, timeout=5, message="the wake-up kept for later")
        assert state(job.id) == "pending", "not claimed into the busy worker's buffer"
        flag.touch()
        wait_until(lambda: done(job.id), timeout=5, message="claimed once the thread freed")
    finally:
        flag.touch()
        spare.close()
