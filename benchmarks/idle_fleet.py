#!/usr/bin/env python
"""An idle fleet of worker processes: connections held, CPU per idle minute, claims per job.

Starts ``--workers`` worker processes (20) against a dedicated database, two ways in turn:

- separate: ``--workers`` independent ``run_jobqueue`` processes, each with its own listener (what
  separate hosts or containers look like);
- group: one ``run_jobqueue --processes N``, whose supervisor runs one listener for the group.

For each it reports the connections the idle fleet holds (per worker process), the CPU the whole
fleet burns per idle minute, and the claim statements per job while a trickle of jobs arrives
(one ``enqueue()`` every ``--gap`` seconds, 50 ms by default, each committed on its own). Claims
are counted by the workers themselves (each prints ``N claims (M empty)`` when it stops); the
claims a fleet makes by starting and stopping are measured in a run without jobs and subtracted.

    python benchmarks/idle_fleet.py [--workers 20] [--jobs 200] [--gap 0.05] [--idle 20]
        [--concurrency 2] [--job-ms 0] [--json FILE]

With ``--job-ms`` the trickle's jobs sleep that long, so that workers are busy while jobs arrive
(with ``--concurrency 1``, a worker's only thread): a fleet under a moderate load. It also
reports how long the trickle's jobs waited to start (``started_at - run_after``), p50 and p99.

Targets (issue 8): at most 2 dedicated connections per worker process, at most 3 claims per job.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import environ
import psycopg

REPO = Path(__file__).resolve().parents[1]
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/postgres"
CLAIMS = re.compile(r"(\d+) claims \((\d+) empty\)")
TICKS = os.sysconf("SC_CLK_TCK")


def libpq(url, name):
    db = environ.Env.db_url_config(url)
    params = {
        "dbname": name,
        "user": db.get("USER"),
        "password": db.get("PASSWORD"),
        "host": db.get("HOST"),
        "port": db.get("PORT"),
    }
    return {k: str(v) for k, v in params.items() if v not in (None, "")}


def prepare_database(url, name, env):
    with psycopg.connect(**libpq(url, "postgres"), autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "migrate",
            "-v0",
            "--settings",
            "benchmarks.fleet_settings",
        ],
        cwd=REPO,
        env=env,
        check=True,
    )


class Fleet:
    started = []  # every fleet of this run: killed on the way out, should a step fail

    def __init__(self, mode, workers, env, logdir, concurrency=2):
        Fleet.started.append(self)
        self.mode = mode
        self.logs = []
        self.processes = []
        base = [sys.executable, "-m", "django", "run_jobqueue", "--settings",
                "benchmarks.fleet_settings", "--concurrency", str(concurrency)]  # fmt: skip
        commands = (
            [base] * workers if mode == "separate" else [[*base, "--processes", str(workers)]]
        )
        for index, command in enumerate(commands):
            log = logdir / f"{mode}-{index}-{time.monotonic_ns()}.log"
            with open(log, "wb") as out:
                self.processes.append(
                    subprocess.Popen(
                        command,
                        cwd=REPO,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            self.logs.append(log)

    def pids(self):
        """Every live process of the fleet (supervisors, workers, listener processes)."""
        leaders = {p.pid for p in self.processes}
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[3]) in leaders and fields[0] != "Z":  # session id
                    found.append(int(entry.name))
        return found

    def cpu_seconds(self):
        total = 0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime + stime
        return total / TICKS

    def kill(self):
        """SIGKILL whatever is left of the fleet (a step of the run failed)."""
        for pid in self.pids():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def stop(self):
        for process in self.processes:
            os.kill(process.pid, signal.SIGTERM)
        for process in self.processes:
            process.wait(60)
        claims = empty = 0
        for log in self.logs:
            for c, e in CLAIMS.findall(log.read_text(errors="replace")):
                claims += int(c)
                empty += int(e)
        return claims, empty


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def sessions(admin, name):
    return admin.execute(
        # A listener: a connection whose last statement was its LISTEN (a group's listener, and
        # workers before they listened on their own session), or a worker's own session, which
        # LISTENs and claims (its application_name says so).
        "SELECT count(*), count(*) FILTER (WHERE query LIKE 'LISTEN %%' "
        "OR application_name LIKE 'dbqueue %% (LISTEN %%'), "
        "count(*) FILTER (WHERE state <> 'idle') FROM pg_stat_activity "
        "WHERE datname = %s AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
        [name],
    ).fetchone()


def settle(admin, name, workers, mode):
    """Wait until every worker listens (or the group's one listener does) and all are idle."""
    listeners = workers if mode == "separate" else 1
    wait_until(lambda: sessions(admin, name)[1] == listeners, 120, f"{listeners} listeners")
    stable_since, last = time.monotonic(), None
    while time.monotonic() - stable_since < 2.0:
        now = sessions(admin, name)
        if now != last:
            stable_since, last = time.monotonic(), now
        time.sleep(0.1)
    return last


def postgres_cpu_seconds():
    """CPU seconds used so far by every postgres process of this machine (the server's cost)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def drain(admin, jobs):
    """Enqueue ``jobs`` no-op jobs at once and time the fleet draining them; returns
    ``(jobs/s, jobs per second of PostgreSQL CPU)``."""
    from django_dbqueue import enqueue_many

    ids = []
    for start in range(0, jobs, 1000):
        ids += [j.id for j in enqueue_many([("bench-noop", {})] * min(1000, jobs - start))]
    cpu, t0 = postgres_cpu_seconds(), time.monotonic()
    wait_until(
        lambda: (
            admin.execute(
                "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'done'", [ids]
            ).fetchone()[0]
            == len(ids)
        ),
        300,
        "the drain",
    )
    elapsed, pg = time.monotonic() - t0, postgres_cpu_seconds() - cpu
    return jobs / elapsed, jobs / pg if pg else float("inf")


def close_django_connections():
    from django.db import connections

    connections.close_all()


def trickle(jobs, gap, job_ms=0.0):
    from django_dbqueue import enqueue

    ids = []
    next_at = time.monotonic()
    for _ in range(jobs):
        if job_ms:
            ids.append(enqueue("bench-sleep", {"sleep": job_ms / 1000.0}).id)
        else:
            ids.append(enqueue("bench-noop").id)
        next_at += gap
        time.sleep(max(0.0, next_at - time.monotonic()))
    return ids


def run_mode(mode, args, env, admin, logdir):
    # Start-up and shutdown claims, without jobs.
    fleet = Fleet(mode, args.workers, env, logdir, args.concurrency)
    settle(admin, args.database, args.workers, mode)
    base_claims, _ = fleet.stop()

    fleet = Fleet(mode, args.workers, env, logdir, args.concurrency)
    total, listeners, _busy = settle(admin, args.database, args.workers, mode)
    cpu_before, t0 = fleet.cpu_seconds(), time.monotonic()
    time.sleep(args.idle)
    cpu_per_minute = (fleet.cpu_seconds() - cpu_before) / (time.monotonic() - t0) * 60
    ids = trickle(args.jobs, args.gap, args.job_ms)
    close_django_connections()  # this process's own connection is not the fleet's
    wait_until(
        lambda: (
            admin.execute(
                "SELECT count(*) FROM dbqueue_job WHERE id = ANY(%s) AND state = 'done'", [ids]
            ).fetchone()[0]
            == len(ids)
        ),
        120,
        "the trickle to be done",
    )
    claims, empty = fleet.stop()
    claims_per_job = (claims - base_claims) / args.jobs
    wait_p50, wait_p99 = admin.execute(
        "SELECT percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY "
        "extract(epoch FROM started_at - run_after) * 1000) FROM dbqueue_job WHERE id = ANY(%s)",
        [ids],
    ).fetchone()[0]
    rate = per_core = None
    if args.drain:
        fleet = Fleet(mode, args.workers, env, logdir, args.concurrency)
        settle(admin, args.database, args.workers, mode)
        rate, per_core = drain(admin, args.drain)
        close_django_connections()
        fleet.stop()
    admin.execute("TRUNCATE dbqueue_job")
    return {
        "drain_jobs_per_s": rate,
        "jobs_per_pg_cpu_s": per_core,
        "mode": mode,
        "connections": total,
        "per_process": total / args.workers,
        "listeners": listeners,
        "cpu_per_idle_minute": cpu_per_minute,
        "claims_per_job": claims_per_job,
        "empty_share": empty / claims if claims else 0.0,
        "wait_p50_ms": wait_p50,
        "wait_p99_ms": wait_p99,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between jobs")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle CPU measured")
    parser.add_argument("--database", default="dbqueue_bench_fleet")
    parser.add_argument("--modes", default="separate,group")
    parser.add_argument("--concurrency", type=int, default=2, help="threads per worker process")
    parser.add_argument("--job-ms", type=float, default=0.0, help="how long each job sleeps")
    parser.add_argument(
        "--drain", type=int, default=20000, help="no-op jobs the fleet drains (0: skip)"
    )
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)

    url = os.environ.get("DATABASE_URL", DEFAULT_URL)
    env = dict(os.environ, DATABASE_URL=url, DBQUEUE_BENCH_DATABASE=args.database)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("DJANGO_SETTINGS_MODULE", None)
    prepare_database(url, args.database, env)
    os.environ.update(DBQUEUE_BENCH_DATABASE=args.database, DATABASE_URL=url)
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.fleet_settings"
    sys.path.insert(0, str(REPO))
    import django

    django.setup()

    results = []
    with (
        psycopg.connect(**libpq(url, args.database), autocommit=True) as admin,
        tempfile.TemporaryDirectory() as logdir,
    ):
        admin.execute("TRUNCATE dbqueue_job")
        try:
            for mode in args.modes.split(","):
                print(f"[{mode}] {args.workers} worker processes ...", flush=True)
                results.append(run_mode(mode, args, env, admin, Path(logdir)))
        finally:
            for fleet in Fleet.started:  # no worker outlives a failed run
                fleet.kill()

    print()
    print(
        f"{args.workers} idle worker processes (concurrency {args.concurrency}); trickle: "
        f"{args.jobs} jobs of {args.job_ms:g} ms, one every {args.gap * 1000:g} ms; idle CPU over "
        f"{args.idle:g} s"
    )
    header = (
        f"{'mode':<10} {'connections':>11} {'per process':>11} {'listeners':>9} "
        f"{'CPU s/idle min':>14} {'claims/job':>10} {'start p50/p99 ms':>16}   target"
    )
    print(header)
    for r in results:
        ok = r["per_process"] <= 2 and r["claims_per_job"] <= 3
        print(
            f"{r['mode']:<10} {r['connections']:>11} {r['per_process']:>11.2f} "
            f"{r['listeners']:>9} {r['cpu_per_idle_minute']:>14.2f} {r['claims_per_job']:>10.2f}"
            f" {r['wait_p50_ms']:>7.2f}/{r['wait_p99_ms']:<8.2f}"
            f"   <= 2 conn/process, <= 3 claims/job: {'PASS' if ok else 'MISS'}"
        )
    if args.drain:
        print()
        print(f"the same fleets draining {args.drain} no-op jobs enqueued at once:")
        for r in results:
            print(
                f"{r['mode']:<10} {r['drain_jobs_per_s']:>9,.0f} jobs/s   "
                f"{r['jobs_per_pg_cpu_s']:>9,.0f} jobs per second of PostgreSQL CPU (one core)"
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "modes": results}, indent=2))


if __name__ == "__main__":
    main()
