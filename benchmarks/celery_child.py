"""The child processes of ``benchmarks/celery_compare.py``: both sides' producers, and the Celery
side's chores on its broker. ``python -m benchmarks.celery_child COMMAND --side ours|celery``,
started by the harness with ``DJANGO_SETTINGS_MODULE=benchmarks.celery_settings`` and the
environment that names the database, the broker and the count directory. Ours runs in the
harness's venv; Celery's in the benchmark's own (``.venvs/bench-celery``), where django_dbqueue
is not installed: nothing here imports either side at module level.

Commands:

- ``wakeup-producer``: prints ``ready <clock>`` (bench.py's producer protocol), then for each
  ``<seq>`` line read hands one job off (ours: ``enqueue()`` in ``transaction.atomic()``;
  Celery: ``delay()``); at ``end`` prints ``{seq: [before, after]}``: the clock before the call,
  and after the hand-off (ours: the COMMIT's return, read by an ``on_commit`` hook registered
  before ``enqueue()``'s, so our wake-up statement comes after it; Celery: ``delay()``'s
  return).
- ``view-producer --count K``: prints ``ready``, waits for ``go``, then commits K "view"
  transactions: an invoice ``INSERT`` and the job (ours: ``enqueue()``; Celery:
  ``delay_on_commit()``, which is ``transaction.on_commit(partial(task.delay, ...))``), and
  prints ``{"count", "started", "finished"}``.
- ``fill --count N`` (Celery): publishes tasks 1..N to the queue ``bench``.
- ``release --workers K`` (Celery): tells the K workers to consume ``bench``
  (``control.add_consumer``) and waits for their K replies.
- ``broker-state`` (Celery): ``{"ready": messages in bench, "unacked": Redis's unacked}``.
- ``purge`` (Celery): empties ``bench`` and ``bench-hold`` (and Redis's unacked messages).
- ``versions --url URL ...`` (Celery): the client libraries' versions and each broker server's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

QUEUE = "bench"  # the Celery queue of the tasks (CELERY_TASK_DEFAULT_QUEUE)
HOLD_QUEUE = "bench-hold"  # the empty queue a drain's workers consume until released


def setup(side):
    """Django (both sides; the database for the view producers), and the side's hand-off."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.celery_settings")
    os.environ["DBQUEUE_BENCH_SIDE"] = side
    tasks = None
    if side == "celery":  # the Celery app first, then Django, as Celery's Django guide has it
        from benchmarks import celery_tasks as tasks
    import django

    django.setup()
    return tasks


# --------------------------------------------------------------------------------------------
# Producers
# --------------------------------------------------------------------------------------------
def wakeup_handoff(side, tasks):
    """``handoff(seq) -> (before, after)``: one job, handed off alone."""
    from django.db import transaction

    if side == "celery":

        def handoff(seq):
            before = time.perf_counter()
            tasks.counted.delay(seq)
            return before, time.perf_counter()

        return handoff

    from benchmarks.celery_jobs import TYPE
    from django_dbqueue import enqueue

    def handoff(seq):
        times = {}
        with transaction.atomic():
            # Registered before enqueue()'s hook: runs first, as soon as COMMIT has returned.
            transaction.on_commit(lambda: times.setdefault("after", time.perf_counter()))
            times["before"] = time.perf_counter()
            enqueue(TYPE, {"i": seq})
        return times["before"], times["after"]

    return handoff


def wakeup_producer(args, tasks):
    handoff = wakeup_handoff(args.side, tasks)
    from django.db import connection

    connection.ensure_connection()
    print(f"ready {time.perf_counter()!r}", flush=True)
    times = {}
    for line in sys.stdin:
        if line.strip() == "end":
            break
        seq = int(line)
        times[seq] = handoff(seq)
    print(json.dumps(times), flush=True)


def view_transaction(side, tasks):
    """``commit(number)``: one view's transaction, an invoice row and its job, committed."""
    from django.db import connection, transaction

    from benchmarks.bench import INSERT_INVOICE

    def invoice_id(number):
        values = {"number": number, "customer": "Celery Compare Ltd", "amount": 1999}
        with connection.cursor() as cursor:
            cursor.execute(INSERT_INVOICE, values)
            return cursor.fetchone()[0]

    if side == "celery":

        def commit(number):
            with transaction.atomic():
                tasks.counted.delay_on_commit(invoice_id(number))

        return commit

    from benchmarks.celery_jobs import TYPE
    from django_dbqueue import enqueue

    def commit(number):
        with transaction.atomic():
            enqueue(TYPE, {"i": invoice_id(number)})

    return commit


def view_producer(args, tasks):
    commit = view_transaction(args.side, tasks)
    from django.db import connection

    connection.ensure_connection()
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit("view-producer: expected 'go'")
    started = time.perf_counter()
    for i in range(args.count):
        commit(f"V{os.getpid()}-{i}")
    finished = time.perf_counter()
    print(json.dumps({"count": args.count, "started": started, "finished": finished}), flush=True)


# --------------------------------------------------------------------------------------------
# The Celery side's chores on its broker
# --------------------------------------------------------------------------------------------
def fill(args, tasks):
    """Tasks 1..count in ``bench``, published on one connection before any worker runs."""
    started = time.perf_counter()
    with tasks.app.producer_or_acquire() as producer:
        for i in range(1, args.count + 1):
            tasks.counted.apply_async((i,), producer=producer)
    print(json.dumps({"published": args.count, "seconds": time.perf_counter() - started}))


def release(args, tasks):
    """Every worker starts consuming ``bench`` at once: a broadcast, answered by each."""
    replies = tasks.app.control.add_consumer(
        QUEUE, reply=True, limit=args.workers, timeout=args.timeout
    )
    if len(replies) != args.workers:
        raise SystemExit(f"release: {len(replies)} of {args.workers} workers answered: {replies}")
    print(json.dumps(replies))


def _channel_state(conn, name):
    """Messages ready in queue ``name`` (0 when it does not exist)."""
    from kombu.exceptions import ChannelError

    channel = conn.channel()
    try:
        return channel.queue_declare(name, passive=True).message_count
    except ChannelError:
        return 0
    finally:
        channel.close()


def _redis_unacked(conn):
    channel = conn.default_channel
    return channel.client.hlen(channel.unacked_key) if conn.transport_cls == "redis" else 0


def broker_state(args, tasks):
    with tasks.app.connection_for_write() as conn:
        state = {"ready": _channel_state(conn, QUEUE), "unacked": _redis_unacked(conn)}
    print(json.dumps(state))


def purge(args, tasks):
    from kombu.exceptions import ChannelError

    with tasks.app.connection_for_write() as conn:
        for name in (QUEUE, HOLD_QUEUE):
            channel = conn.channel()
            try:
                channel.queue_purge(name)
            except ChannelError:  # not declared yet
                pass
            finally:
                channel.close()
        if conn.transport_cls == "redis":
            channel = conn.default_channel
            channel.client.delete(
                channel.unacked_key, channel.unacked_index_key, channel.unacked_mutex_key
            )
    print("{}")


def versions(args, tasks):
    import amqp
    import billiard
    import celery
    import kombu
    import redis
    from kombu import Connection

    found = {
        "celery": celery.__version__,
        "kombu": kombu.__version__,
        "amqp": amqp.__version__,
        "billiard": billiard.__version__,
        "redis-py": redis.__version__,
    }
    for url in args.urls:
        with Connection(url) as conn:
            conn.ensure_connection(max_retries=1)
            if conn.transport_cls == "redis":
                server = "Redis " + conn.default_channel.client.info("server")["redis_version"]
            else:
                props = conn.connection.server_properties
                server = f"{props.get('product', 'AMQP')} {props.get('version', '?')}"
        found[url.split(":", 1)[0]] = server
    print(json.dumps(found))


COMMANDS = {
    "wakeup-producer": wakeup_producer,
    "view-producer": view_producer,
    "fill": fill,
    "release": release,
    "broker-state": broker_state,
    "purge": purge,
    "versions": versions,
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=sorted(COMMANDS))
    parser.add_argument("--side", choices=("ours", "celery"), required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument(
        "--url", dest="urls", action="append", default=[], help="versions: a broker"
    )
    args = parser.parse_args(argv)
    if args.side == "ours" and args.command not in ("wakeup-producer", "view-producer"):
        parser.error(f"{args.command} is a chore of the Celery side: use --side celery")
    tasks = setup(args.side)
    COMMANDS[args.command](args, tasks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
