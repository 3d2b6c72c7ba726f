#!/usr/bin/env python
"""Our ``run_jobqueue`` beside Celery on Redis and on RabbitMQ, on the same workloads, in one run.

    python benchmarks/celery_compare.py [--rounds 3] [--jobs 20000] [--json FILE]

Three sides: ours (``manage.py run_jobqueue`` at its defaults), celery+redis and
celery+rabbitmq (Celery workers, prefork, ``--celery-concurrency`` processes each, with the
reliable settings of ``benchmarks/celery_settings.py``: late acks, reject on worker lost, the
prefetch and Redis's visibility timeout stated there). Workers are real processes on both
sides, started for each run and stopped with SIGTERM. The workloads:

- drain-1, drain-2: ``--jobs`` no-op jobs written beforehand, drained by 1 and by 2 worker
  processes. The workers start idle and wait until every one is ready (ours: its LISTEN
  connection is open, on a paused queue; Celery: ``worker_ready``, consuming an empty queue);
  then the backlog is released to all at once (ours: ``resume_queue()``, which wakes them;
  Celery: ``control.add_consumer``). Timed from the first handler's start to the last one's end.
- view-1, view-P: "a view's transaction": an invoice INSERT and its job, committed (ours:
  ``enqueue()`` in ``transaction.atomic()``; Celery: ``delay_on_commit()`` in the same block,
  Celery's documented pattern). ``--view-tx`` transactions split among 1 and ``--producers``
  producer processes, while one worker process of the side runs; transactions per second
  from the first start to the last commit, then every committed invoice's job is counted.
- wakeup: an idle worker, and a producer handing off one job at a time (``--wakeups``,
  ``--gap`` apart): the handler's start minus the commit's return (ours) or ``delay()``'s
  return (Celery), p50 and p99; and the same from before the call.

Every handler, on every side, appends its key to a file of its own process
(``benchmarks/celery_count.py``); after each run the harness compares the keys that ran with
those that should have, and reports lost and repeated executions per side and workload. The
sides alternate, in a rotated order each round; the table gives the median of the rounds with
[min..max].

Celery and its libraries are never dependencies of the package or the test venvs: the first run
makes a venv of its own (``--celery-venv``, ``.venvs/bench-celery``) with the pinned versions
below. Redis (``--redis-url``) and RabbitMQ (``--rabbitmq-url``) must be running; the script says
how to start them when they are not. The database (``--database``, created and migrated on
first use on ``DATABASE_URL``'s server) is emptied before every run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import psycopg  # noqa: E402

from benchmarks import bench, celery_count  # noqa: E402

SIDES = ("ours", "celery+redis", "celery+rabbitmq")
WORKLOADS = ("drain", "view", "wakeup")
# The Celery side's venv: these exact versions, plus the Django, psycopg and django-environ of
# the interpreter that runs this script (the producers' Django is the same on both sides).
CELERY_PINS = [
    "celery[redis]==5.7.0",
    "kombu==5.7.0",
    "amqp==5.4.2",
    "billiard==4.3.2",
    "vine==5.1.0",
    "redis==8.2.0",
]
START_COMMANDS = {
    "redis": 'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" '
    "--appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log",
    "amqp": "rabbitmq-server -detached",
}
LISTENING = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND application_name LIKE 'dbqueue worker (LISTEN %%'
"""
FILL = bench.FILL.replace("'bench-noop'", "'bench-counted'")
assert FILL != bench.FILL


# --------------------------------------------------------------------------------------------
# The Celery side's venv and services
# --------------------------------------------------------------------------------------------
def celery_requirements():
    import django
    import environ

    psycopg_spec = "psycopg[binary]" if psycopg.pq.__impl__ == "binary" else "psycopg"
    return [
        *CELERY_PINS,
        f"Django=={django.get_version()}",
        f"{psycopg_spec}=={psycopg.__version__}",
        f"django-environ=={environ.__version__}",
    ]


def ensure_celery_venv(venv):
    """``venv``'s python, after creating the venv or installing into it when its pins differ."""
    python = venv / "bin" / "python"
    stamp = venv / ".celery-compare-pins"
    wanted = "\n".join(celery_requirements())
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    base = getattr(sys, "_base_executable", sys.executable)
    print(f"creating the Celery side's venv {venv} ({base})", flush=True)
    subprocess.run([base, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", *wanted.split("\n")], check=True
    )
    stamp.write_text(wanted)
    return python


def service_down(url):
    """None when something answers at ``url``'s host and port, else what to do about it."""
    parsed = urllib.parse.urlsplit(url)
    default = {"redis": 6379, "amqp": 5672}[parsed.scheme]
    host, port = parsed.hostname or "127.0.0.1", parsed.port or default
    try:
        with socket.create_connection((host, port), timeout=2):
            return None
    except OSError as exc:
        return (
            f"nothing answers at {host}:{port} ({exc.strerror or exc}) for {url}; "
            f"start it with: {START_COMMANDS[parsed.scheme]}"
        )


# --------------------------------------------------------------------------------------------
# One run's processes
# --------------------------------------------------------------------------------------------
class Context:
    """What every run needs: the arguments, the database, the interpreters, the brokers."""

    def __init__(self, args, env, celery_python):
        self.args = args
        self.env = env  # bench.Env of the bench database
        self.celery_python = celery_python
        self.brokers = {"celery+redis": args.redis_url, "celery+rabbitmq": args.rabbitmq_url}

    def child_env(self, side, counts, starts_port=None):
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="benchmarks.celery_settings",
            DBQUEUE_BENCH_SIDE="ours" if side == "ours" else "celery",
            DBQUEUE_BENCH_DATABASE=self.args.database,
            DBQUEUE_BENCH_BROKER=self.brokers.get(side, ""),
            DBQUEUE_BENCH_PREFETCH=str(self.args.celery_prefetch),
            PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
        )
        env[celery_count.COUNT_DIR] = str(counts)
        env.pop(celery_count.STARTS_PORT, None)
        if starts_port:
            env[celery_count.STARTS_PORT] = str(starts_port)
        return env

    def python(self, side):
        return sys.executable if side == "ours" else str(self.celery_python)

    def chore(self, side, command, *extra, counts="."):
        """A Celery-side chore (celery_child.py), its JSON answer."""
        done = subprocess.run(
            [self.python(side), "-m", "benchmarks.celery_child", command, "--side", "celery"]
            + [str(x) for x in extra],
            cwd=REPO,
            env=self.child_env(side, counts),
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        if done.returncode:
            raise bench.InvalidRun(f"{side}: {command} failed:\n{done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


class Workers:
    """``count`` worker processes of one side for one run: ours ``run_jobqueue`` at its
    defaults, Celery's ``celery worker`` (prefork); their output goes to files in ``run_dir``."""

    def __init__(self, ctx, side, count, run_dir, *, queue_name="bench", starts_port=None):
        self.ctx, self.side, self.count, self.run_dir = ctx, side, count, run_dir
        self.counts = run_dir / "counts"
        self.counts.mkdir(parents=True, exist_ok=True)
        env = ctx.child_env(side, self.counts, starts_port)
        self.procs = []
        for i in range(count):
            if side == "ours":
                cmd = [sys.executable, "-m", "django", "run_jobqueue"]
            else:
                cmd = [
                    str(ctx.celery_python), "-m", "celery", "-A", "benchmarks.celery_tasks",
                    "worker", "--pool", "prefork",
                    "--concurrency", str(ctx.args.celery_concurrency),
                    "--loglevel", "WARNING", "-Q", queue_name, "-n", f"bench{i}@%h",
                ]  # fmt: skip
            log = open(run_dir / f"worker-{i}.log", "wb")  # noqa: SIM115 - closed in stop()
            self.procs.append(
                (subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log), log)
            )

    def alive(self, what):
        for proc, _log in self.procs:
            if proc.poll() is not None:
                raise bench.InvalidRun(
                    f"{what}: a worker exited with {proc.returncode}: {self.tail()}"
                )

    def ready_count(self):
        if self.side == "ours":
            return self.ctx.env.admin.execute(LISTENING).fetchone()[0]
        return len(list(self.counts.glob("ready-*")))

    def wait_ready(self, deadline=120.0):
        stop_at = time.monotonic() + deadline
        while self.ready_count() < self.count:
            self.alive(f"{self.side}: start-up")
            if time.monotonic() > stop_at:
                raise bench.InvalidRun(f"{self.side}: workers not ready after {deadline}s")
            time.sleep(0.05)

    def stop(self):
        for proc, _log in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = []
        for proc, log in self.procs:
            try:
                codes.append(proc.wait(timeout=60))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(f"killed after 60 s: {proc.wait()}")
            log.close()
        if any(code != 0 for code in codes):
            raise bench.InvalidRun(f"{self.side}: workers exited {codes}: {self.tail()}")

    def abandon(self):
        """After a failed run: stop the workers without judging how they exit."""
        with contextlib.suppress(bench.InvalidRun):
            self.stop()

    def tail(self):
        text = "".join(p.read_text(errors="replace") for p in self.run_dir.glob("worker-*.log"))
        return text[-1500:]


def wait_for_runs(workers, expected, args):
    """Until ``expected`` keys have run; False when the count stalls for ``--stall`` seconds
    or the run passes ``--deadline`` (the check then says what is missing)."""
    progress = celery_count.Progress(workers.counts)
    stop_at = time.monotonic() + args.deadline
    last, last_change = -1, time.monotonic()
    while (seen := progress.count()) < expected:
        workers.alive(f"{workers.side}: waiting for {expected} runs")
        now = time.monotonic()
        if seen != last:
            last, last_change = seen, now
        if now - last_change > args.stall or now > stop_at:
            return False
        time.sleep(0.05)
    return True


def finish(ctx, workers, expected_keys, complete):
    """Stop the workers, count every run, compare with ``expected_keys``; and what is left
    undone in the queue (ours: jobs not done; Celery: messages ready or unacknowledged)."""
    workers.stop()
    tally = celery_count.tally(workers.counts)
    result = {"check": celery_count.check(expected_keys, tally.runs), "tally": tally}
    if workers.side == "ours":
        states = ctx.env.states()
        result["left"] = sum(n for state, n in states.items() if state != "done")
    else:
        left = ctx.chore(workers.side, "broker-state")
        result["left"] = left["ready"] + left["unacked"]
    if not complete:
        result["invalid"] = f"stalled or past the deadline: {result['check'].describe()}"
    return result


@contextlib.contextmanager
def running(workers):
    """The workers, stopped without judgement if the run fails before :func:`finish`."""
    try:
        yield workers
    except BaseException:
        workers.abandon()
        raise


# --------------------------------------------------------------------------------------------
# The workloads, one run of one side each
# --------------------------------------------------------------------------------------------
def prepare(ctx, side):
    """Empty tables (and, for Celery, an empty broker queue); our queue not paused."""
    from django_dbqueue import resume_queue

    ctx.env.reset()
    resume_queue("default", by="celery_compare")
    if side != "ours":
        ctx.chore(side, "purge")


def run_drain(ctx, side, run_dir, processes):
    """``--jobs`` jobs written first, released at once to ``processes`` ready workers."""
    from django_dbqueue import pause_queue, resume_queue

    n = ctx.args.jobs
    prepare(ctx, side)
    if side == "ours":
        pause_queue("default", by="celery_compare")
        ctx.env.admin.execute(FILL, {"queue": bench.QUEUE, "n": n})
        ctx.env.admin.execute("VACUUM ANALYZE dbqueue_job")
    else:
        ctx.chore(side, "fill", "--count", n)
    with running(Workers(ctx, side, processes, run_dir, queue_name="bench-hold")) as workers:
        workers.wait_ready()
        if side == "ours":
            resume_queue("default", by="celery_compare")
        else:
            ctx.chore(side, "release", "--workers", processes)
        complete = wait_for_runs(workers, n, ctx.args)
    result = finish(ctx, workers, range(1, n + 1), complete)
    tally = result.pop("tally")
    result["value"] = n / (tally.last_end - tally.first_start) if tally.processes else None
    result["processes"] = len(tally.processes)  # processes that ran a job (Celery: children)
    return result


def child_process(ctx, side, command, counts, *extra):
    """A producer of ``side`` (celery_child.py), driven through its stdin and stdout."""
    role = "ours" if side == "ours" else "celery"
    return subprocess.Popen(
        [ctx.python(side), "-m", "benchmarks.celery_child", command, "--side", role]
        + [str(x) for x in extra],
        cwd=REPO,
        env=ctx.child_env(side, counts),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def run_view(ctx, side, run_dir, producers):
    """``--view-tx`` view transactions from ``producers`` processes, one worker running."""
    total = ctx.args.view_tx
    shares = [total // producers + (1 if i < total % producers else 0) for i in range(producers)]
    prepare(ctx, side)
    with running(Workers(ctx, side, 1, run_dir)) as workers:
        workers.wait_ready()
        children = [
            child_process(ctx, side, "view-producer", workers.counts, "--count", k) for k in shares
        ]
        try:
            for child in children:
                if child.stdout.readline().strip() != "ready":
                    raise bench.InvalidRun(f"{side}: a view producer did not start")
            for child in children:
                child.stdin.write("go\n")
                child.stdin.flush()
            outcomes = []
            for child in children:
                out, _ = child.communicate(timeout=ctx.args.deadline)
                if child.returncode:
                    raise bench.InvalidRun(f"{side}: a view producer exited {child.returncode}")
                outcomes.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
        invoices = [row[0] for row in ctx.env.admin.execute("SELECT id FROM bench_invoice")]
        complete = wait_for_runs(workers, len(invoices), ctx.args)
    result = finish(ctx, workers, invoices, complete)
    result.pop("tally")
    seconds = max(o["finished"] for o in outcomes) - min(o["started"] for o in outcomes)
    result["value"] = sum(o["count"] for o in outcomes) / seconds
    result["committed"] = len(invoices)
    return result


class Starts:
    """The handlers' start times, sent as datagrams by celery_count.started: the ``started``
    queue that bench.time_wakeups reads, remembering every start it handed out."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.queue = queue.SimpleQueue()
        self.seen = {}
        threading.Thread(target=self._receive, name="starts", daemon=True).start()

    def _receive(self):
        while True:
            key, at = self.sock.recv(256).decode().split()
            self.queue.put((int(key), float(at)))

    def empty(self):
        return self.queue.empty()

    def get_nowait(self):
        return self.queue.get_nowait()

    def get(self, timeout):
        seq, at = self.queue.get(timeout=timeout)
        self.seen[seq] = at
        return seq, at


class Producer(bench.ProcessProducer):
    """bench.py's wake-up producer, run by celery_child.py with either side's Python. The child
    answers ``[before, after]`` per job: ``finish()`` gives bench.time_wakeups the 'after' and
    keeps the 'before', for the figure from the call."""

    def __init__(self, ctx, side, counts):
        self.proc = child_process(ctx, side, "wakeup-producer", counts)
        ready = self.proc.stdout.readline().split()
        if not ready or ready[0] != "ready":
            self.proc.kill()
            raise bench.InvalidRun(f"{side}: the wake-up producer did not start ({ready!r})")
        if abs(time.perf_counter() - float(ready[1])) > 1.0:
            self.proc.kill()
            raise bench.InvalidRun("the producer's time.perf_counter() is not this process's")
        self.before = {}

    def finish(self):
        out, _ = self.proc.communicate("end\n", timeout=30)
        pairs = {int(seq): pair for seq, pair in json.loads(out).items()}
        self.before = {seq: pair[0] for seq, pair in pairs.items()}
        return {seq: pair[1] for seq, pair in pairs.items()}


def run_wakeup(ctx, side, run_dir, starts):
    """``--wakeups`` jobs handed off one at a time to an idle worker, after one untimed."""
    n = ctx.args.wakeups
    prepare(ctx, side)
    out_of_turn = None
    with running(Workers(ctx, side, 1, run_dir, starts_port=starts.port)) as workers:
        workers.wait_ready()
        producer = Producer(ctx, side, workers.counts)
        try:
            producer.commit(-1)  # the first job after start-up: not timed
            if (got := starts.get(timeout=30)[0]) != -1:
                raise bench.InvalidRun(f"{side}: expected the warm-up job to start, got {got}")
            try:
                figures = bench.time_wakeups(n, ctx.args.gap, producer, starts)
            except bench.InvalidRun as exc:
                # A start out of turn (a job run twice, or one never started): no figure, but
                # the count of what was handed off still says which.
                out_of_turn = str(exc)
        finally:
            if producer.proc.poll() is None:
                producer.proc.kill()
        handed_off = sorted(producer.before) or [-1]
        complete = wait_for_runs(workers, len(handed_off), ctx.args)
    result = finish(ctx, workers, handed_off, complete)
    result.pop("tally")
    if out_of_turn:
        result["invalid"] = f"{out_of_turn}; {result['check'].describe()}"
        return result
    from_call = [(starts.seen[s] - producer.before[s]) * 1000.0 for s in range(n)]
    result.update(
        p50=figures["p50"],
        p99=figures["p99"],
        call_p50=celery_count.percentile(sorted(from_call), 50),
        call_p99=celery_count.percentile(sorted(from_call), 99),
    )
    return result


# --------------------------------------------------------------------------------------------
# The plan, the table, the main loop
# --------------------------------------------------------------------------------------------
def plan(args):
    """``[(label, run function, its argument, what it measures)]`` for the chosen workloads."""
    p = args.producers
    runs = []
    if "drain" in args.only:
        runs += [
            ("drain-1", run_drain, 1, f"drain of {args.jobs:,} no-op jobs, 1 worker process"),
            ("drain-2", run_drain, 2, f"drain of {args.jobs:,} no-op jobs, 2 worker processes"),
        ]
    if "view" in args.only:
        runs += [
            ("view-1", run_view, 1, "view transactions (row + job), 1 producer"),
            (f"view-{p}", run_view, p, f"view transactions (row + job), {p} producers"),
        ]
    if "wakeup" in args.only:
        runs.append(("wakeup", run_wakeup, None, f"wake-up of an idle worker, {args.wakeups} jobs"))
    return runs


# (title, field of a run's result, unit, format)
FIGURES = {
    "drain": [("{what}", "value", "jobs/s", "{:,.0f}")],
    "view": [("{what}", "value", "tx/s", "{:,.0f}")],
    "wakeup": [
        ("wake-up p50, from the commit (ours) / delay()'s return (Celery)", "p50", "ms", "{:.2f}"),
        ("wake-up p99, from the commit (ours) / delay()'s return (Celery)", "p99", "ms", "{:.2f}"),
        ("wake-up p50, from the call of enqueue() / delay()", "call_p50", "ms", "{:.2f}"),
        ("wake-up p99, from the call of enqueue() / delay()", "call_p99", "ms", "{:.2f}"),
    ],
}


def cell(runs, key, fmt):
    """``median [min..max]`` of the valid runs' ``key`` (one run: the figure alone)."""
    figures = celery_count.spread(r.get(key) for r in runs if "invalid" not in r)
    if figures is None:
        return "no valid run"
    median, low, high = figures
    valid = sum("invalid" not in r for r in runs)
    if valid == 1:
        return fmt.format(median)
    return f"{fmt.format(median)} [{fmt.format(low)}..{fmt.format(high)}]"


def counted_cell(runs):
    """Lost and repeated executions over every run of a side, and what was left in its queue."""
    checks = [r["check"] for r in runs if "check" in r]
    if not checks:
        return "not counted"
    lost = sum(len(c.lost) for c in checks)
    repeated = sum(c.repeated for c in checks)
    unexpected = sum(len(c.unexpected) for c in checks)
    left = sum(r.get("left", 0) for r in runs)
    text = f"{lost} lost, {repeated} repeated of {sum(c.expected for c in checks):,}"
    if unexpected:
        text += f", {unexpected} unexpected"
    if left:
        text += f", {left} left in the queue"
    return text


def table(results, runs, sides):
    """The figures and the counts as Markdown tables (for benchmarks/results/)."""
    lines = ["| workload | unit | " + " | ".join(sides) + " |", "|---|---|" + "---|" * len(sides)]
    for label, _fn, _arg, what in runs:
        for title, key, unit, fmt in FIGURES[label.split("-")[0]]:
            cells = [cell(results[label][side], key, fmt) for side in sides]
            lines.append(f"| {title.format(what=what)} | {unit} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "| executions counted | " + " | ".join(sides) + " |",
        "|---|" + "---|" * len(sides),
    ]
    for label, _fn, _arg, what in runs:
        cells = [counted_cell(results[label][side]) for side in sides]
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def describe(result):
    if "invalid" in result:
        return f"INVALID: {result['invalid']}"
    figures = (
        f"p50 {result['p50']:.2f} ms, p99 {result['p99']:.2f} ms (from the call: "
        f"p50 {result['call_p50']:.2f}, p99 {result['call_p99']:.2f})"
        if "p50" in result
        else f"{result['value']:,.0f}/s"
    )
    return (
        f"{figures}; {result['check'].describe()}, left {result['left']}; "
        f"load {result.get('load', '?')}"
    )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--rounds", type=int, default=3, help="runs of every workload on every side (3)")
    add("--jobs", type=int, default=20000, help="the drain's backlog (20,000)")
    add("--view-tx", type=int, default=3000, help="view transactions per run, all producers")
    add("--producers", type=int, default=4, help="producer processes of view-P (4)")
    add("--wakeups", type=int, default=300, help="jobs timed one by one (300)")
    add("--gap", type=float, default=0.02, help="idle seconds between wake-up jobs (0.02)")
    add("--only", default=",".join(WORKLOADS), help="drain,view,wakeup")
    add("--sides", default=",".join(SIDES), help="ours,celery+redis,celery+rabbitmq")
    add("--celery-concurrency", type=int, default=2, help="prefork processes per Celery worker")
    add("--celery-prefetch", type=int, default=4, help="worker_prefetch_multiplier (4)")
    add("--redis-url", default="redis://127.0.0.1:6379/3")
    add("--rabbitmq-url", default="amqp://guest:guest@127.0.0.1:5672//")
    add("--celery-venv", type=Path, default=REPO / ".venvs" / "bench-celery")
    add("--database", default="dbqueue_bench_celery")
    add("--deadline", type=float, default=600.0, help="seconds a run may take at most")
    add("--stall", type=float, default=30.0, help="seconds without a run before giving up")
    add("--log-dir", type=Path, help="workers' logs and counts (default: a new temp dir)")
    add("--json", metavar="FILE", help="every run's figures and counts")
    args = parser.parse_args(argv)
    args.only = [w.strip() for w in args.only.split(",") if w.strip()]
    args.sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    for name, values, known in (("--only", args.only, WORKLOADS), ("--sides", args.sides, SIDES)):
        unknown = [v for v in values if v not in known]
        if unknown or not values:
            parser.error(f"{name} {','.join(values)!r}: choose among {', '.join(known)}")
    for name in ("rounds", "jobs", "view_tx", "producers", "wakeups", "celery_concurrency"):
        if getattr(args, name) < 1:
            parser.error(
                f"--{name.replace('_', '-')} must be at least 1, not {getattr(args, name)}"
            )
    if args.celery_prefetch < 0:
        parser.error(f"--celery-prefetch must be 0 or more, not {args.celery_prefetch}")
    if args.producers < 2 and "view" in args.only:
        parser.error(
            f"--producers must be at least 2 (view-1 is the one-producer run), not {args.producers}"
        )
    args.synchronous_commit, args.django_prepared = "server", False  # bench.bench_database's
    return args


def main(argv=None):
    args = parse_args(argv)
    celery_sides = [s for s in args.sides if s != "ours"]
    urls = {"celery+redis": args.redis_url, "celery+rabbitmq": args.rabbitmq_url}
    down = [f"{side}: {problem}" for side in celery_sides if (problem := service_down(urls[side]))]
    if down:
        print("\n".join(down), file=sys.stderr)
        return 2
    celery_python = ensure_celery_venv(args.celery_venv) if celery_sides else None

    db = bench.bench_database(args)
    bench.ensure_database(db, args.database)
    bench.setup_django(db, dbqueue={"QUEUES": {"default": {}}})
    bench.close_django_connections()
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="dbqueue-celery-compare-"))
    runs = plan(args)
    results = {label: {side: [] for side in args.sides} for label, *_ in runs}
    starts = Starts()
    with psycopg.connect(**bench.libpq_params(db), autocommit=True) as admin:
        env = bench.Env(params=bench.libpq_params(db), admin=admin)
        ctx = Context(args, env, celery_python)
        facts = bench.machine_facts(env)
        if celery_sides:
            facts["celery_side"] = ctx.chore(
                celery_sides[0], "versions", *[f"--url={url}" for url in urls.values()]
            )
        print(f"command: {' '.join(sys.argv)}")
        print(f"machine: {json.dumps(facts)}")
        print(
            f"Celery: prefork, concurrency {args.celery_concurrency} per worker, "
            f"worker_prefetch_multiplier {args.celery_prefetch}, task_acks_late, "
            "task_reject_on_worker_lost, Redis visibility_timeout 3600 s; "
            "ours: run_jobqueue at its defaults"
        )
        print(f"logs and counts: {log_dir}", flush=True)
        began = time.monotonic()
        for round_ in range(args.rounds):
            order = args.sides[round_ % len(args.sides) :] + args.sides[: round_ % len(args.sides)]
            print(
                f"round {round_ + 1}: commit {env.commit_ms():.2f} ms, "
                f"load average {os.getloadavg()[0]:.2f}, sides in the order {', '.join(order)}",
                flush=True,
            )
            for label, function, argument, _what in runs:
                for side in order:
                    run_dir = log_dir / f"round{round_ + 1}" / f"{label}-{side}"
                    run_dir.mkdir(parents=True, exist_ok=True)
                    extra = starts if function is run_wakeup else argument
                    try:
                        result = function(ctx, side, run_dir, extra)
                    except bench.InvalidRun as exc:
                        result = {"invalid": str(exc)}
                    result["load"] = round(os.getloadavg()[0], 2)  # the machine, as it ended
                    results[label][side].append(result)
                    print(
                        f"  round {round_ + 1} {label:>7} {side:>15}: {describe(result)}",
                        flush=True,
                    )
        minutes = (time.monotonic() - began) / 60.0
    print()
    print(table(results, runs, args.sides))
    print(
        f"\n{args.rounds} rounds in {minutes:.1f} minutes; load average now {os.getloadavg()[0]:.2f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report(args, facts, minutes, results), indent=2))
    bad = problems(results)
    if bad:
        print("\n".join(["runs to look at (their logs and counts are kept):", *bad]))
        return 1
    return 0


def problems(results):
    """One line per run that is invalid, or lost, repeated or left an execution behind."""
    lines = []
    for label, by_side in results.items():
        for side, runs in by_side.items():
            for number, r in enumerate(runs, 1):
                if "invalid" in r:
                    lines.append(f"  {label} {side} round {number}: INVALID: {r['invalid']}")
                elif not r["check"].clean or r["left"]:
                    lines.append(
                        f"  {label} {side} round {number}: {r['check'].describe()}, "
                        f"left in the queue {r['left']}"
                    )
    return lines


def report(args, facts, minutes, results):
    """Everything as JSON: the arguments, the machine, every run with its counts."""

    def plain(r):
        out = {k: v for k, v in r.items() if k != "check"}
        if "check" in r:
            c = r["check"]
            out["check"] = {
                "expected": c.expected,
                "executions": c.executions,
                "lost": len(c.lost),
                "repeated": c.repeated,
                "unexpected": len(c.unexpected),
            }
        return out

    return {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "facts": facts,
        "minutes": minutes,
        "results": {
            label: {side: [plain(r) for r in runs] for side, runs in by_side.items()}
            for label, by_side in results.items()
        },
    }


if __name__ == "__main__":
    sys.exit(main())
